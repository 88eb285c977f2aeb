"""Peak figures of the accelerators the planner knows, each with where it comes from.

Figures are vendors' published peaks (dense, no sparsity). Memory is the
capacity the runtime reports (``nvidia-smi`` / ``npu-smi`` total, in GiB), not
the marketing number in GB. Link figures are what the vendor publishes; NVLink
and HCCS are quoted as the total of both directions, so the planner uses half
of them per direction. Scale-out figures are per device (a node's NICs divided
by its devices).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcore_dapo.errors import UserError


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bf16_tflops: float  # dense peak, 16-bit matmul
    hbm_gib: float  # capacity the runtime reports
    intra_gbps: float  # GB/s per device inside a node, as published (both directions for NVLink/HCCS)
    intra_bidirectional: bool
    inter_gbps: float  # GB/s per device between nodes, one direction
    intra_link: str
    inter_link: str
    source: str
    hbm_tbps: float = 0.0  # peak memory bandwidth, TB/s (10^12 bytes/s), as published
    fp8: bool = False  # FP8 tensor cores (the datasheets: Hopper has them, Ampere and the 910B do not)

    @property
    def intra_bytes_per_s(self) -> float:
        """One-direction bandwidth per device inside a node, bytes/s."""
        return self.intra_gbps * 1e9 / (2 if self.intra_bidirectional else 1)

    @property
    def inter_bytes_per_s(self) -> float:
        return self.inter_gbps * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tbps * 1e12

    def as_dict(self) -> dict:
        return asdict(self)


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        DeviceSpec(
            name="h100", bf16_tflops=989.0, hbm_gib=79.6, intra_gbps=900.0, intra_bidirectional=True,
            inter_gbps=50.0, intra_link="NVLink 4 (900 GB/s)", inter_link="8x InfiniBand NDR 400 Gb/s per node",
            source="NVIDIA H100 SXM5 datasheet: 989 TFLOPS BF16 dense (1,979 with sparsity), 80 GB HBM3 "
                   "(81,559 MiB reported), 3.35 TB/s HBM bandwidth, NVLink 900 GB/s; DGX H100: 8x ConnectX-7 400 Gb/s",
            hbm_tbps=3.35, fp8=True,
        ),
        DeviceSpec(
            name="h200", bf16_tflops=989.0, hbm_gib=140.4, intra_gbps=900.0, intra_bidirectional=True,
            inter_gbps=50.0, intra_link="NVLink 4 (900 GB/s)", inter_link="8x InfiniBand NDR 400 Gb/s per node",
            source="NVIDIA H200 SXM datasheet: 989 TFLOPS BF16 dense, 141 GB HBM3e (143,771 MiB reported), "
                   "4.8 TB/s HBM bandwidth, NVLink 900 GB/s; DGX H200: 8x ConnectX-7 400 Gb/s",
            hbm_tbps=4.8, fp8=True,
        ),
        DeviceSpec(
            name="a100", bf16_tflops=312.0, hbm_gib=80.0, intra_gbps=600.0, intra_bidirectional=True,
            inter_gbps=25.0, intra_link="NVLink 3 (600 GB/s)", inter_link="8x InfiniBand HDR 200 Gb/s per node",
            source="NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS BF16 dense, 80 GB HBM2e at 2,039 GB/s, NVLink "
                   "600 GB/s; DGX A100: 8x ConnectX-6 200 Gb/s",
            hbm_tbps=2.039,
        ),
        DeviceSpec(
            name="a2", bf16_tflops=313.0, hbm_gib=64.0, intra_gbps=392.0, intra_bidirectional=True,
            inter_gbps=25.0, intra_link="HCCS full mesh (7x 56 GB/s)", inter_link="8x 200GE RoCE per node",
            source="Ascend 910B in an Atlas 800T A2 node. Assumption: Huawei publishes no per-SKU datasheet; "
                   "~313 TFLOPS FP16 is the figure commonly cited for the 910B training parts and BF16 is "
                   "taken equal; 64 GB HBM2e at the commonly cited 1.6 TB/s (four stacks; the 910C, two 910B dies, is "
                   "quoted at 3.2 TB/s); 8 NPUs in a HCCS full mesh (7 links of 56 GB/s); 8x 200GE RoCE "
                   "ports per node",
            hbm_tbps=1.6,
        ),
    )
}
ALIASES = {"910b": "a2", "ascend910b": "a2", "h100-sxm": "h100", "h200-sxm": "h200"}


def get_device(name: str) -> DeviceSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DEVICES:
        raise UserError(
            f"device={name!r} is not known: accepted are {', '.join(DEVICES)} (aliases: {', '.join(ALIASES)})"
        )
    return DEVICES[key]
