"""The `fhmon` subcommands, one module per family; monitor/cli.py builds the parser.

- daemons.py: `serve` and `keeper`, the node's long-running services
- keys.py: `keygen` and `key`, the signing-key steps of docs/operations.md
- ask.py: `probe` and `status`, questions to a running fhmon over its socket
- node.py: `launch`, `check` and `demo`, things run on the node itself
- kubevirt.py: `inject`, `webhook`, `device-plugin` and `install-launcher`
- running.py: what the services share: run until a signal, report start-up failures
"""
