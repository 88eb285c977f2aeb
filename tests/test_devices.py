"""Device adapters: selection, and MindSpeed's import order checked with a stand-in MindSpeed."""

import subprocess
import sys
import textwrap

import pytest

from mcore_dapo.devices import get_adapter
from mcore_dapo.errors import UserError


def test_cpu_is_detected_here_and_overridable(monkeypatch):
    from mcore_dapo.devices import detect

    assert detect() == "cpu"
    assert get_adapter().name == "cpu" and get_adapter().backend == "gloo"
    monkeypatch.setenv("MCORE_DAPO_DEVICE", "cuda")
    assert get_adapter().name == "cuda" and get_adapter().backend == "nccl"
    with pytest.raises(UserError, match="device='tpu' is not accepted: accepted are cuda, npu, cpu"):
        get_adapter("tpu")


STANDIN = {
    "mindspeed/__init__.py": "",
    "mindspeed/megatron_adaptor.py": textwrap.dedent("""
        import sys
        import order_log
        order_log.events.append(("adaptor", "megatron" in sys.modules))
        {repatch}
    """),
    "order_log.py": "events = []\n",
}
REPATCH = "def repatch(flags):\n    order_log.events.append(('repatch', dict(flags)))\n"


def _standin(tmp_path, with_repatch=True):
    for rel, text in STANDIN.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text.replace("{repatch}", REPATCH if with_repatch else ""))
    return tmp_path


def _run(tmp_path, code):
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**__import__("os").environ, **env})


def test_mindspeed_comes_before_megatron_and_flags_before_model_parallel(tmp_path):
    out = _run(_standin(tmp_path), """
        import sys, order_log
        from mcore_dapo.devices.npu import NpuAdapter, MindSpeedOrderError
        a = NpuAdapter()
        a.prepare()
        import megatron.core
        order_log.events.append(("megatron", True))
        a.configure({"use_flash_attn": True})
        a.mark_model_parallel_initialised()
        try:
            a.configure({"use_fused_rmsnorm": True})
        except MindSpeedOrderError as e:
            order_log.events.append(("late-flags-refused", "before initialize_model_parallel" in str(e)))
        print(order_log.events)
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    events = eval(out.stdout.strip().splitlines()[-1])
    assert events == [("adaptor", False), ("megatron", True), ("repatch", {"use_flash_attn": True}),
                      ("late-flags-refused", True)]


def test_megatron_imported_first_is_a_loud_error(tmp_path):
    out = _run(_standin(tmp_path), """
        import megatron.core
        from mcore_dapo.devices.npu import NpuAdapter, MindSpeedOrderError
        try:
            NpuAdapter().prepare()
        except MindSpeedOrderError as e:
            print("refused:", e)
    """)
    assert "refused: Megatron was imported before MindSpeed" in out.stdout, out.stderr[-2000:]


def test_flags_on_a_mindspeed_without_repatch_are_refused(tmp_path):
    out = _run(_standin(tmp_path, with_repatch=False), """
        from mcore_dapo.devices.npu import NpuAdapter, MindSpeedOrderError
        a = NpuAdapter(); a.prepare()
        a.configure({})  # no flags: fine
        try:
            a.configure({"use_flash_attn": True})
        except MindSpeedOrderError as e:
            print("refused:", e)
    """)
    assert "refused: this MindSpeed has no mindspeed.megatron_adaptor.repatch" in out.stdout, out.stderr[-2000:]
    assert "use_flash_attn" in out.stdout


def test_importing_mcore_dapo_and_the_bridge_does_not_import_megatron():
    """So that MindSpeed can still be imported first on Ascend."""
    out = subprocess.run([sys.executable, "-c", (
        "import sys, mcore_dapo, mcore_dapo.bridge, mcore_dapo.devices, mcore_dapo.runtime.model, "
        "mcore_dapo.harness.logits, mcore_dapo.patching.megatron_cpu, mcore_dapo.patching.verl_cpu, "
        "mcore_dapo.cli.main;"
        "print(sorted(m for m in sys.modules if m.startswith('megatron')))")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_cuda_and_npu_adapters_import_and_describe_here():
    cuda, npu = get_adapter("cuda"), get_adapter("npu")
    assert cuda.describe() == {"device": "cuda", "backend": "nccl", "transformer_engine": False}
    assert npu.describe() == {"device": "npu", "backend": "hccl"}
    assert not npu.detect() and not cuda.detect()
