"""Device adapters: selection, and MindSpeed's import order checked with a stand-in MindSpeed."""

import subprocess
import sys
import textwrap

import pytest

from mcore_dapo.devices import get_adapter
from mcore_dapo.errors import UserError


@pytest.mark.no_accelerator  # asserts that this host has no CUDA or NPU device
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
        "mcore_dapo.convert.forward_check, mcore_dapo_checks.logits, mcore_dapo.patching.megatron_cpu, mcore_dapo.patching.verl_cpu, "
        "mcore_dapo.cli.main;"
        "print(sorted(m for m in sys.modules if m.startswith('megatron')))")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.cpu_only
def test_the_cpu_defers_torch_compile_while_megatron_imports():
    """In a clean process: the CPU adapter's prepare, then Megatron's model and MoE modules: inductor's compiler
    (torch._inductor.compile_fx, what torch.compile's default backend imports) is not imported, Megatron's jit_fuser
    is the deferring compile, torch.compile is torch's own again. (Without prepare the same imports load it on both
    lines: the first value turns True. torch 2.7.1 imports some of torch._inductor's configuration with dynamo
    whatever Megatron does.)"""
    code = ("import sys, torch; real = torch.compile; from mcore_dapo.devices import get_adapter; "
            "get_adapter('cpu').prepare(); import megatron.core.models.gpt, megatron.core.transformer.moe.moe_layer; "
            "from megatron.core import jit; "
            "print('torch._inductor.compile_fx' in sys.modules, jit.jit_fuser is real, torch.compile is real)")
    assert printed_last(code, 3) == ["False", "False", "True"]


@pytest.mark.cpu_only
@pytest.mark.main_stack_only  # megatron-core 0.12.1 imports no wandb (its inference context has no such import)
def test_wandb_loads_at_its_first_use_after_megatron_imports_it():
    """In a clean process: Megatron's inference context imports wandb (HAVE_WANDB), its code has not run (none of its
    submodules imported) after the CPU adapter's prepare and Megatron's imports, inspect.getmodule (which asks every
    module for __file__) does not load it, and the first use (here importing a submodule first) loads the one instance
    Megatron holds. (Without prepare the first value turns True.)"""
    code = ("import sys, inspect; from mcore_dapo.devices import get_adapter; get_adapter('cpu').prepare(); "
            "import megatron.core.models.gpt; from megatron.core.inference.contexts import dynamic_context as d; "
            "inspect.getmodule(inspect.currentframe()); loaded = 'wandb.sdk' in sys.modules; "
            "import wandb.sdk.lib; from wandb import Table; "
            "print(loaded, d.HAVE_WANDB, d.wandb is wandb is sys.modules['wandb'], 'wandb.sdk' in sys.modules, "
            "callable(wandb.init) and Table.__module__.startswith('wandb.'))")
    assert printed_last(code, 5) == ["False", "True", "True", "True", "True"]


def printed_last(code: str, n: int) -> list[str]:
    """The last ``n`` words ``code`` printed in a clean interpreter (Megatron's import warnings come before)."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.split()[-n:]


def test_a_deferred_compile_compiles_at_the_first_call_with_its_arguments():
    import torch

    from mcore_dapo.devices.cpu import compile_at_first_call

    graphs = []

    def record(gm, example_inputs):  # a torch.compile backend: what was compiled, run as traced
        graphs.append(gm)
        return gm.forward

    def double(x):
        return 2 * x

    def triple(x):
        return 3 * x

    real = torch.compile
    restore = compile_at_first_call()
    try:
        direct, decorated = torch.compile(double, backend=record), torch.compile(backend=record)(triple)
    finally:
        restore()
    assert torch.compile is real and graphs == []
    x = torch.arange(3.0)
    assert torch.equal(direct(x), 2 * x) and len(graphs) == 1
    assert torch.equal(decorated(x), 3 * x) and len(graphs) == 2
    assert torch.equal(direct(x + 1), 2 * (x + 1)) and len(graphs) == 2  # compiled once, the guards hold


@pytest.mark.no_accelerator
def test_cuda_and_npu_adapters_import_and_describe_here():
    cuda, npu = get_adapter("cuda"), get_adapter("npu")
    assert cuda.describe() == {"device": "cuda", "backend": "nccl", "transformer_engine": False}
    assert npu.describe() == {"device": "npu", "backend": "hccl"}
    assert not npu.detect() and not cuda.detect()


THD = ("actor_rollout_ref.model.use_remove_padding=True packs sequences (THD), which Megatron's attention without "
       "Transformer Engine cannot run: set actor_rollout_ref.model.use_remove_padding=False on the CPU")


def test_cpu_adapter_answers_what_callers_would_branch_on():
    import torch
    from megatron.core.transformer.enums import AttnBackend

    cpu = get_adapter("cpu")
    assert not cpu.has_device_memory() and cpu.memory_allocated() is None
    module = torch.nn.Linear(2, 2)
    assert cpu.to_device(module) is module and cpu.local_device() == torch.device("cpu")
    assert cpu.fast.attention_backend(AttnBackend.flash) is AttnBackend.local and cpu.fast.attention_backend(None) is None
    with pytest.raises(UserError) as e:
        cpu.fast.check_packed_sequences("actor_rollout_ref.model.use_remove_padding")
    assert str(e.value) == THD
    cpu.fast.check_context_parallel(1)
    with pytest.raises(UserError, match="cp=2 is not accepted on the CPU: .*accepted is cp=1"):
        cpu.fast.check_context_parallel(2)
    assert not cpu.fast.takes_feature_flags() and cpu.fast.feature_flags({"use_flash_attn": True}, 2) == {}
    with pytest.raises(ValueError, match="takes no feature flags"):
        cpu.configure({"use_flash_attn": True})
    cpu.mark_model_parallel_initialised()  # every adapter has the hook


CUDA_THD = ("actor_rollout_ref.model.use_remove_padding=True packs sequences (THD), which Megatron's attention runs "
            "only with Transformer Engine, and transformer_engine does not import here: accepted on CUDA without "
            "Transformer Engine is actor_rollout_ref.model.use_remove_padding=False (or install Transformer Engine)")


def test_cuda_refuses_packed_sequences_where_transformer_engine_does_not_import():
    from mcore_dapo.devices.cuda import te_available

    cuda = get_adapter("cuda")
    assert cuda.fast.packed_sequences_need_installed_software  # a dry run elsewhere cannot answer it
    assert not get_adapter("cpu").fast.packed_sequences_need_installed_software
    if te_available():  # a CUDA machine with Transformer Engine: THD runs
        assert cuda.fast.packed_sequences_supported()
        cuda.fast.check_packed_sequences("actor_rollout_ref.model.use_remove_padding")
        return
    assert not cuda.fast.packed_sequences_supported()
    with pytest.raises(UserError) as e:
        cuda.fast.check_packed_sequences("actor_rollout_ref.model.use_remove_padding")
    assert str(e.value) == CUDA_THD


@pytest.mark.no_accelerator
def test_cuda_and_npu_adapters_answer_here_without_a_device():
    from megatron.core.transformer.enums import AttnBackend

    cuda, npu = get_adapter("cuda"), get_adapter("npu")
    for a in (cuda, npu):
        assert a.has_device_memory()
        assert a.fast.attention_backend(AttnBackend.flash) is AttnBackend.flash
        a.fast.check_context_parallel(4)
    npu.fast.check_packed_sequences("actor_rollout_ref.model.use_remove_padding")
    assert npu.memory_allocated() is None  # no torch.npu without torch_npu
    assert not cuda.fast.takes_feature_flags() and cuda.fast.feature_flags({"use_flash_attn": False}, 2) == {}
    assert npu.fast.takes_feature_flags()
    assert npu.fast.feature_flags(None, 1) == {"use_flash_attn": True}
    assert npu.fast.feature_flags({"use_flash_attn": False, "use_fused_rmsnorm": True}, 2) == {
        "use_flash_attn": False, "use_fused_rmsnorm": True, "context_parallel_size": 2}


def test_the_adapters_answer_what_a_vllm_engine_beside_the_trainer_needs():
    """Ray resources, vLLM's memory arguments and environment, the model check: asked of the adapter
    (sync-bench --rollout vllm, selfcheck's rollout_sync), not branched on the device's name."""
    cpu, cuda, npu = get_adapter("cpu"), get_adapter("cuda"), get_adapter("npu")
    assert cpu.rollout.ray_resources() == ({"num_cpus": 2, "num_gpus": 0}, {"num_cpus": 0})
    assert cuda.rollout.ray_resources() == ({"num_gpus": 1}, {"num_cpus": 0, "num_gpus": 1})
    assert npu.rollout.ray_resources() == ({"resources": {"NPU": 1}}, {"num_cpus": 0, "resources": {"NPU": 1}})
    assert cpu.rollout.engine_settings(0.3) == ({"VLLM_CPU_KVCACHE_SPACE": "1"}, {})
    for a in (cuda, npu):
        assert a.rollout.engine_settings(0.3) == ({}, {"gpu_memory_utilization": 0.3})
        a.rollout.check_model(16)  # a device's attention kernels take head_dim 16
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:  # vLLM's CPU build says which sizes its attention takes
        with pytest.raises(UserError, match=r"^head_dim=16 is not supported by vLLM's CPU attention"):
            cpu.rollout.check_model(16)
        cpu.rollout.check_model(32)
    assert cpu.device_identity() is None and npu.device_identity() is None
    # separate_async's weight transport: verl's registered names ("nccl" is also the HCCL engine's on Ascend,
    # verl/checkpoint_engine/__init__.py); the CPU's is the project's gloo engine, registered by its module
    assert cuda.rollout.checkpoint_engine() == npu.rollout.checkpoint_engine() == ("nccl", None)
    assert cpu.rollout.checkpoint_engine() == ("gloo", "mcore_dapo.verl_cpu.checkpoint_engine")


def test_no_branch_on_a_devices_name_outside_the_device_places():
    """Callers ask the adapter; a device's name is compared only in devices/ and host.py (the host's detection),
    in the patches of patching/ (each for its device) and in verl_cpu/ (verl on the CPU). Text only: every module of the package and tools/."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    name = r"""["'](?:cpu|cuda|npu)["']"""
    branch = re.compile(rf"""[!=]=\s*{name}|{name}\s*[!=]=|\bin\s*\(\s*{name}""")
    allowed = ("mcore_dapo/devices/", "mcore_dapo/host.py", "mcore_dapo/patching/", "mcore_dapo/verl_cpu/")
    found = []
    for f in sorted([*(root / "mcore_dapo").rglob("*.py"), *(root / "tools").rglob("*.py")]):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(allowed):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if branch.search(code) and ".device.type" not in code:  # a tensor's placement is not the device's name
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_adapter_is_split_by_concern():
    # the life cycle on DeviceAdapter, the fast paths on adapter.fast, the rollout engine's settings on
    # adapter.rollout: no method in two of them, each device's parts subclassed in its own file
    from mcore_dapo.devices.base import DeviceAdapter
    from mcore_dapo.devices.fast_paths import FastPaths
    from mcore_dapo.devices.rollout import RolloutSettings

    def own(cls):
        return {n for n in vars(cls) if not n.startswith("__")} - {"name", "adapter"}

    parts = [own(DeviceAdapter), own(FastPaths), own(RolloutSettings)]
    assert all(not (a & b) for i, a in enumerate(parts) for b in parts[i + 1:]), parts
    for name in ("cpu", "cuda", "npu"):
        adapter = get_adapter(name)
        for part, base in ((adapter.fast, FastPaths), (adapter.rollout, RolloutSettings)):
            assert isinstance(part, base) and part.adapter is adapter
            assert type(part).__module__ == type(adapter).__module__ == f"mcore_dapo.devices.{name}"
