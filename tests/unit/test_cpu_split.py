"""bench.cpu_split folds `perf script` text into layers and syscalls: checked on text shaped
like perf's own (the live run is tests/bench/test_bench_perf.py)."""

from __future__ import annotations

from bench import cpu_split

WITH_CHAINS = """\
100/101
\tffffffff81001 prepare_creds ([kernel.kallsyms])
\tffffffff81002 __sys_setfsuid ([kernel.kallsyms])
\tffffffff81003 do_syscall_64 ([kernel.kallsyms])
\tffffffff81004 entry_SYSCALL_64_after_hwframe ([kernel.kallsyms])
\t    7f0000001 syscall (/usr/lib/x86_64-linux-gnu/libc.so.6)

100/101
\tffffffff81011 find_inode_fast ([kernel.kallsyms])
\tffffffff81012 exportfs_decode_fh_raw ([kernel.kallsyms])
\tffffffff81013 do_handle_open ([kernel.kallsyms])
\tffffffff81014 do_syscall_64 ([kernel.kallsyms])
\tffffffff81015 entry_SYSCALL_64_after_hwframe ([kernel.kallsyms])

100/102
\tffffffff81021 seccomp_notify_ioctl ([kernel.kallsyms])
\tffffffff81022 __x64_sys_ioctl ([kernel.kallsyms])
\tffffffff81023 x64_sys_call ([kernel.kallsyms])
\tffffffff81024 do_syscall_64 ([kernel.kallsyms])

100/101
\tffffffff81031 do_syscall_64 ([kernel.kallsyms])
\tffffffff81032 entry_SYSCALL_64_after_hwframe ([kernel.kallsyms])

100/101
\tffffffff81041 task_work_run ([kernel.kallsyms])
\tffffffff81042 syscall_exit_to_user_mode ([kernel.kallsyms])
\tffffffff81043 do_syscall_64 ([kernel.kallsyms])

100/101
\tffffffff81051 finish_task_switch.isra.0 ([kernel.kallsyms])
\tffffffff81052 __schedule ([kernel.kallsyms])
\tffffffff81053 worker_thread ([kernel.kallsyms])

200/201
\tffffffff81061 __x64_sys_getpid ([kernel.kallsyms])
\tffffffff81062 do_syscall_64 ([kernel.kallsyms])
"""

WITHOUT_CHAINS = """\
   100/101       7f0000010 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)
   100/101       7f0000020 _PyEval_EvalFrameDefault (/root/.pyenv/versions/3.11.7/bin/python3.11)
   100/101  ffffffff81001 prepare_creds ([kernel.kallsyms])
   100/101       7f0000030 HMAC_Update (/usr/lib/x86_64-linux-gnu/libcrypto.so.3)
   100/101       7f0000040 [unknown] (/x/site-packages/cryptography/hazmat/bindings/_rust.abi3.so)
   100/101       7f0000050 ffi_call (/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2)
   100/101       7f0000060 _ctypes_callproc (/x/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so)
   100/101       7f0000070 malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)
   100/101       7f0000080 __vdso_clock_gettime ([vdso])
   100/101       7f0000090 s_pack (/x/lib-dynload/_struct.cpython-311-x86_64-linux-gnu.so)
   300/301       7f00000a0 main (/usr/bin/perf)
"""


def test_syscalls_are_named_by_the_function_do_syscall_64_called() -> None:
    split = cpu_split.parse(WITH_CHAINS, {100})
    assert split.samples == 6  # pid 200's sample is not fhmon's
    assert split.layers == {"kernel": 6}
    assert split.syscalls == {
        "setfsuid": 1,  # __sys_setfsuid: the x64 wrapper is inlined
        "open_by_handle_at": 1,  # do_handle_open
        "ioctl": 1,  # through x64_sys_call
        "(syscall entry and exit)": 1,
        "(syscall exit work: syscall_exit_to_user_mode)": 1,
        "(outside syscalls: irqs, scheduler)": 1,
    }
    assert split.symbols["prepare_creds ([kernel.kallsyms])"] == 1


def test_every_pid_is_kept_without_a_filter() -> None:
    assert cpu_split.parse(WITH_CHAINS).syscalls["getpid"] == 1


def test_layers_come_from_the_innermost_frame_s_object() -> None:
    split = cpu_split.parse(WITHOUT_CHAINS, {100})
    assert split.samples == 10
    assert split.layers == {"interpreter": 2, "kernel": 1, "cryptography": 2,
                            "ctypes + libffi": 2, "libc": 2, "other": 1}


def test_render_gives_microseconds_per_call() -> None:
    layers = cpu_split.parse(WITHOUT_CHAINS, {100})
    kernel = cpu_split.parse(WITH_CHAINS, {100})
    text = cpu_split.render(layers, kernel, (10, 6), hz=1000)
    # 10 samples at 1 kHz over 10 calls: 1 ms of CPU per call, 2 samples of it interpreter
    assert "1000.0 us per call" in text
    assert "interpreter" in text and "200.00 us/call" in text
    # 1 of 6 kernel samples in setfsuid, over 6 calls: 1 ms / 6
    assert any(line.split()[0] == "setfsuid" and "166.67 us/call" in line
               for line in text.splitlines())


def test_lines_that_are_not_samples_are_ignored() -> None:
    assert cpu_split.parse("garbage\n\t not a frame\n\n").samples == 0


def test_the_native_plane_is_a_layer_of_its_own() -> None:
    from bench.cpu_split import layer_of

    assert layer_of("/x/monitor/_native.abi3.so") == "native plane"
    assert layer_of("/usr/lib/libpython3.11.so.1.0") == "interpreter"
