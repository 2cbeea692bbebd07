#!/usr/bin/env bash
# Build fhmon's DaemonSet image as an OCI image layout, without a container daemon or
# registry: the base is made here from Debian bookworm's packages (mmdebstrap), fhmon's
# wheel and its locked dependencies are installed into a second layer from outside the
# root filesystem (no pip, compiler or cargo inside the image), and umoci writes the layout
# and the image config. deploy/Containerfile is the same recipe for builders that have a
# daemon; tests/deploy/test_image_recipe.py keeps the two from drifting.
#
#   bash scripts/build-image.sh [OUT]      (as root; OUT defaults to build/image)
#
# Result: OUT/oci, an OCI layout with the tag $TAG (push it with skopeo, docs/deploy.md).
# The bootstrap, the downloaded wheels and fhmon's wheel are cached under OUT/cache: a
# rerun redoes only what changed (the bootstrap when this script changed, fhmon's wheel
# when the sources changed).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=$(realpath -m "${1:-build/image}")
cache=$out/cache

# What the image is; tests/deploy/test_image_recipe.py reads these lines and compares them
# with deploy/Containerfile (its runtime stage's packages, USER, ENTRYPOINT, CMD, paths).
SUITE=bookworm
# libstdc++6: grpcio's extension links it (the Containerfile's python:slim base has it).
PACKAGES="python3 libseccomp2 libstdc++6 ca-certificates"
IMAGE_USER=0
ENTRYPOINT=fhmon
CMD="serve --config /etc/fhmon/config.toml"
SECCOMP_DIR=/usr/share/fhmon/seccomp
SITE=/usr/local/lib/python3.11/dist-packages
TAG=${FHMON_IMAGE_TAG:-latest}

if [ "$(id -u)" -ne 0 ]; then
    echo "build-image.sh: run as root (mmdebstrap's root mode, files owned by root)" >&2
    exit 1
fi
for tool in mmdebstrap umoci; do
    command -v "$tool" >/dev/null || {
        echo "build-image.sh: $tool is missing: apt-get install mmdebstrap umoci" >&2; exit 1; }
done
# The host's Python builds and installs the wheels for the image's, so both must be the
# same minor version (bookworm's 3.11): the wheels' ABI tags must fit the image.
PY=/usr/bin/python3
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    echo "build-image.sh: $PY must be Python 3.11 (bookworm's), to build for the image" >&2
    exit 1; }
if [ -x .venv/bin/pip ]; then PIP=(.venv/bin/pip); else PIP=("$PY" -m pip); fi
PIP+=(--disable-pip-version-check --no-cache-dir -q)
mkdir -p "$cache"
start=$(date +%s)

# 1. The base layer: bookworm's Essential packages plus the runtime ones, no apt, no docs,
# man pages or locales, no apt lists or caches; usrmerge (which the bootstrap installs to
# merge /usr) goes again with the full perl it pulls in (45 MB; perl-base stays; forced:
# init-system-helpers names usrmerge or usr-is-merged, and /usr is merged already). Rebuilt only when this script changes.
base=$cache/base.tar
if [ ! -s "$base" ] || [ "$0" -nt "$base" ]; then
    echo "build-image.sh: bootstrapping $SUITE ($PACKAGES)"
    # shellcheck disable=SC2086
    mmdebstrap --quiet --mode=root --variant=essential --format=tar \
        --include="${PACKAGES// /,}" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='chroot "$1" dpkg --purge --force-depends $(chroot "$1" dpkg-query -W -f "\${Package}\n" \
            usrmerge perl libperl5.36 perl-modules-5.36 "lib*-perl" 2>/dev/null)' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/* "$1"/var/log/*' \
        --customize-hook='find "$1"/usr -name __pycache__ -prune -exec rm -rf {} +' \
        "$SUITE" "$base.tmp"
    mv "$base.tmp" "$base"
fi

# 2. The wheels: the dependencies as locked (hash-checked, binary only), then fhmon's own,
# built on the host; its build backend (build_backend/fhmon_build.py) builds the static
# launcher into it.
wheels=$cache/wheels
mkdir -p "$wheels"
"${PIP[@]}" download --require-hashes --only-binary=:all: --dest "$wheels" \
    -r deploy/requirements.lock
launcher=monitor/_bin/fhmon-launch
fhmon_wheel=$(ls "$wheels"/fhmon-*.whl 2>/dev/null | head -1 || true)
if [ -z "$fhmon_wheel" ] || [ -n "$(find monitor protocol native/src native/build.rs \
        native/launcher native/Cargo.toml native/Cargo.lock pyproject.toml build_backend \
        scripts/build-launcher.sh \
        -newer "$fhmon_wheel" -not -path '*/__pycache__*' 2>/dev/null | head -1)" ]; then
    echo "build-image.sh: building fhmon's wheel"
    rm -f "$wheels"/fhmon-*.whl
    MATURIN_PEP517_ARGS="--locked" "${PIP[@]}" wheel --no-deps --wheel-dir "$wheels" .
    fhmon_wheel=$(ls "$wheels"/fhmon-*.whl)
fi

# 3. The fhmon layer, staged outside the base: the locked dependencies, then fhmon.
stage=$out/stage
rm -rf "$stage"
mkdir -p "$stage$SITE" "$stage/usr/local/bin" "$stage$SECCOMP_DIR"
"${PIP[@]}" install --no-index --find-links "$wheels" --require-hashes --no-compile \
    --target "$stage$SITE" -r deploy/requirements.lock
"${PIP[@]}" install --no-index --no-deps --no-compile --target "$stage$SITE" "$fhmon_wheel"
if [ ! -x "$stage$SITE/$launcher" ]; then
    echo "build-image.sh: $fhmon_wheel has no $launcher (pyproject.toml's build backend)" >&2
    exit 1
fi
# pip --target writes scripts for the host's interpreter: the image's is /usr/bin/python3.
rm -rf "$stage$SITE/bin"
cat > "$stage/usr/local/bin/$ENTRYPOINT" <<'EOF'
#!/usr/bin/python3
import sys

from monitor.cli import main

sys.exit(main())
EOF
chmod 0755 "$stage/usr/local/bin/$ENTRYPOINT"
install -m 0644 deploy/seccomp/*.json "$stage$SECCOMP_DIR/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
tar --numeric-owner --owner=0 --group=0 --sort=name -C "$stage" -cf "$out/fhmon.tar" usr

# 4. The OCI layout: both layers, then the config (user, entrypoint, command, labels).
oci=$out/oci
rm -rf "$oci"
umoci init --layout "$oci"
umoci new --image "$oci:$TAG"
umoci raw add-layer --image "$oci:$TAG" --history.created_by "mmdebstrap $SUITE" "$base"
umoci raw add-layer --image "$oci:$TAG" --history.created_by "fhmon" "$out/fhmon.tar"
version=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
# shellcheck disable=SC2086
umoci config --image "$oci:$TAG" --config.user "$IMAGE_USER" \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env LANG=C.UTF-8 --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.entrypoint "$ENTRYPOINT" $(printf -- '--config.cmd %s ' $CMD) \
    --config.workingdir / \
    --config.label org.opencontainers.image.title=fhmon \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.revision=$revision" \
    --config.label org.opencontainers.image.base.name="debian:$SUITE (mmdebstrap)"
umoci gc --layout "$oci"
rm -rf "$stage" "$out/fhmon.tar"
size=$(du -sm --apparent-size "$oci/blobs" | cut -f1)
echo "build-image.sh: $oci:$TAG, ${size} MB compressed, $(( $(date +%s) - start )) s"
