import pytest
from tests.e2e import harness, migration
from tests.e2e.test_live_migration import KUBEVIRT_MIGRATION, INJECTED_LAUNCH, _report
pytestmark = pytest.mark.e2e
def test_neg(e2e_env):
    with harness.run_dir(harness.NOBODY) as rd:
        res = migration.run_migration(e2e_env, rd, migration_args=KUBEVIRT_MIGRATION, mode=None,
            launch_options=[*INJECTED_LAUNCH, "--virtiofsd-migration=file-handles"], destination_plain=True, symlinks=True)
    _report(res)
    print(res.summary()[:6000])
