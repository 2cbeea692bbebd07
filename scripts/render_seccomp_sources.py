"""Render the runtimes' seccomp profiles into tests/data/seccomp/ from their source trees.

  python3 scripts/render_seccomp_sources.py CONTAINERD_GIT KUBEVIRT_GIT CONTAINERS_COMMON_GIT

Each argument is a git directory (a bare mirror is enough); the files are read at HEAD and
the commits written into tests/data/seccomp/SOURCES.json. What is rendered, and for which
container, is said in tests/data/seccomp/README.md.

- containerd's RuntimeDefault is Go code (contrib/seccomp/seccomp_default.go,
  DefaultProfile(spec)) whose result depends on the architecture, the kernel and the
  container's capability bounding set. Rendered for what KubeVirt's virtiofs container gets
  on an x86-64 node: every capability dropped (virtiofs.go drops ALL), kernel >= 4.8. The
  Go composite literals are parsed, not retyped.
- containers/common's default (CRI-O's RuntimeDefault, and the base of kubevirt.json) is
  pkg/seccomp/seccomp.json, copied as it is.
- kubevirt/kubevirt.json is what virt-handler installs (pkg/virt-handler/seccomp/seccomp.go,
  defaultProfile): containers/common's DefaultProfile (the version KubeVirt vendors) with
  userfaultfd taken out of its ERRNO rule and appended as an ALLOW rule, marshalled compact.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "seccomp"

# golang.org/x/sys/unix values on linux/amd64 used by the literals.
GO_CONSTANTS = {
    "unix.AF_ALG": 38, "unix.AF_VSOCK": 40,
    "unix.CLONE_NEWNS": 0x20000, "unix.CLONE_NEWUTS": 0x4000000, "unix.CLONE_NEWIPC": 0x8000000,
    "unix.CLONE_NEWUSER": 0x10000000, "unix.CLONE_NEWPID": 0x20000000,
    "unix.CLONE_NEWNET": 0x40000000, "unix.CLONE_NEWCGROUP": 0x2000000,
}
ACTIONS = {"ActAllow": "SCMP_ACT_ALLOW", "ActErrno": "SCMP_ACT_ERRNO"}
OPS = {"OpLessThan": "SCMP_CMP_LT", "OpEqualTo": "SCMP_CMP_EQ", "OpGreaterThan": "SCMP_CMP_GT",
       "OpMaskedEqual": "SCMP_CMP_MASKED_EQ", "OpNotEqual": "SCMP_CMP_NE"}
ENOSYS = 38


def git_show(repo: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def git_head(repo: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def strip_comments(go: str) -> str:
    return re.sub(r"//[^\n]*", "", go)


def elements(literal: str) -> list[str]:
    """The top-level `{...}` elements of a composite literal's body."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(literal):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                break  # the end of the enclosing block
            if depth == 0:
                out.append(literal[start:i + 1])
    return out


def value(expr: str) -> int:
    total = 0
    for term in expr.split("|"):
        term = term.strip()
        plus = 0
        if "+" in term:
            term, extra = (t.strip() for t in term.split("+"))
            plus = int(extra, 0)
        total |= (GO_CONSTANTS[term] if term in GO_CONSTANTS else int(term, 0)) + plus
    return total


def syscall(element: str) -> dict[str, Any]:
    """One specs.LinuxSyscall literal as OCI JSON (names, action, errnoRet, args)."""
    names_part = re.search(r"Names:\s*\[\]string\{(.*?)\}", element, re.S)
    assert names_part, element
    rule: dict[str, Any] = {"names": re.findall(r'"([^"]+)"', names_part.group(1))}
    action = re.search(r"Action:\s*specs\.(\w+)", element)
    assert action, element
    rule["action"] = ACTIONS[action.group(1)]
    if re.search(r"ErrnoRet:\s*&nosys", element):
        rule["errnoRet"] = ENOSYS
    args_part = re.search(r"Args:\s*\[\]specs\.LinuxSeccompArg\{(.*)\}", element, re.S)
    args = []
    for arg in elements(args_part.group(1)) if args_part else []:
        fields = dict(re.findall(r"(\w+):\s*([^,\n]+),", arg))
        entry: dict[str, Any] = {"index": int(fields["Index"]), "value": value(fields["Value"])}
        if fields.get("ValueTwo") and value(fields["ValueTwo"]):
            entry["valueTwo"] = value(fields["ValueTwo"])
        entry["op"] = OPS[fields["Op"].removeprefix("specs.")]
        args.append(entry)
    if args:
        rule["args"] = args
    return rule


def between(text: str, start: str, end: str) -> str:
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def appended(text: str) -> list[dict[str, Any]]:
    """The rules of every `specs.LinuxSyscall{...}` literal in `text`, in order."""
    out = []
    for match in re.finditer(r"specs\.LinuxSyscall\{", text):
        (element, *_) = elements(text[match.end() - 1:])
        out.append(syscall(element))
    return out


def containerd_default(go: str) -> dict[str, Any]:
    go = strip_comments(go)
    body = between(go, "syscalls := []specs.LinuxSyscall{", "\ts := &specs.LinuxSeccomp{")
    rules = [syscall(e) for e in elements(body)]
    # Included by kernel version (>= 4.8), then by arch (amd64).
    rules += appended(between(go, "KernelVersion{Kernel: 4, Major: 8}", "switch runtime.GOARCH"))
    arch_switch = go[go.index("switch runtime.GOARCH", go.index("KernelVersion{")):]
    rules += appended(between(arch_switch, 'case "amd64":', 'case "386":'))
    # The capability loop adds nothing for an empty bounding set; then `if !admin`: the
    # default (non-s390) clone rule, and clone3's ENOSYS.
    not_admin = go[go.index("if !admin {"):]
    rules += appended(not_admin[not_admin.index("default:"):])
    return {"defaultAction": "SCMP_ACT_ERRNO",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": rules}


def kubevirt_profile(common_json: str) -> dict[str, Any]:
    profile = json.loads(common_json)
    for rule in profile["syscalls"]:
        if "userfaultfd" in rule["names"] and rule["action"] == "SCMP_ACT_ERRNO":
            rule["names"] = [n for n in rule["names"] if n != "userfaultfd"]
            break
    profile["syscalls"].append({"names": ["userfaultfd"], "action": "SCMP_ACT_ALLOW",
                                "args": [], "comment": "", "includes": {}, "excludes": {}})
    return profile


def main(containerd: str, kubevirt: str, common: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    go = git_show(containerd, "contrib/seccomp/seccomp_default.go")
    (OUT / "containerd-runtime-default-amd64.json").write_text(
        json.dumps(containerd_default(go), indent=2) + "\n")
    common_json = git_show(common, "pkg/seccomp/seccomp.json")
    (OUT / "containers-common-seccomp.json").write_text(common_json)
    vendored = git_show(kubevirt, "vendor/github.com/containers/common/pkg/seccomp/seccomp.json")
    (OUT / "kubevirt.json").write_text(
        json.dumps(kubevirt_profile(vendored), separators=(",", ":")))
    modules = git_show(kubevirt, "vendor/modules.txt")
    common_version = re.search(r"# github.com/containers/common (\S+)", modules)
    sources = {
        "containerd/containerd": {"commit": git_head(containerd),
                                  "path": "contrib/seccomp/seccomp_default.go"},
        "containers/common": {"commit": git_head(common), "path": "pkg/seccomp/seccomp.json"},
        "kubevirt/kubevirt": {
            "commit": git_head(kubevirt), "path": "pkg/virt-handler/seccomp/seccomp.go",
            "containers/common vendored": common_version.group(1) if common_version else None},
    }
    (OUT / "SOURCES.json").write_text(json.dumps(sources, indent=2) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
