"""KubeVirt integration: put the virtiofs containers of virt-launcher pods under fhmon."""
