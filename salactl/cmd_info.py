"""`salactl info`: versions, device, known peaks; `--measure` measures and caches this machine's
copy bandwidth and bf16 matmul rate for the roofline."""

from __future__ import annotations

from typing import Annotated

import typer

from salactl import output
from salactl.options import DeviceOpt, JsonOpt


def info(
    measure: Annotated[bool, typer.Option("--measure", help="Measure copy bandwidth and matmul rate and cache "
                                          "them (in $SALACTL_CACHE_DIR/peaks.json, else "
                                          "~/.cache/salactl/peaks.json; per GPU, or per CPU model, usable CPU "
                                          "count and torch thread count) as the ceilings of later rooflines "
                                          "(run, profile). Each ceiling is the fastest of the repetitions; run "
                                          "it on an idle machine: a measurement on a busy one does not replace "
                                          "an idle one.")] = False,
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Show versions, the device and its roofline ceilings."""
    from salactl.env import environment
    from salactl.runtime.loader import resolve_device, resolve_dtype
    from salactl.runtime.peaks import DATASHEET, CacheDirUnknown, cache_path, check_cache_dir, peaks_for
    from salactl.runtime.peaks_measure import measure_and_store

    dev = resolve_device(device)
    measurement = None
    if measure:
        check_cache_dir()
        output.stderr.print(f"measuring copy bandwidth and bf16 / fp32 matmul on {dev} ...")
        measurement = measure_and_store(dev)
    # what this measurement left in effect: a busy one does not replace an idle one
    peaks = measurement.peaks if measurement else peaks_for(dev)
    try:
        cache = str(cache_path())
    except CacheDirUnknown:
        cache = None
    # with the matmul rate a model in the device's default dtype is held to, as `run --json` has it
    record = {"env": environment(), "device": str(dev), "peaks": peaks.for_dtype(resolve_dtype("auto", dev)),
              "peaks_cache": cache,
              "datasheet": {k: {"mem_gbps": v[0], "bf16_tflops": v[1], "fp32_tflops": v[2]}
                            for k, v in DATASHEET.items()}}
    if measurement:
        record["measurement"] = measurement.to_dict()
    if json_out:
        output.print_json(record)
        return
    env = record["env"]
    output.table("salactl environment", ["item", "value"],
                 [[k, v] for k, v in env.items()])
    output.table("roofline ceilings in use", ["device", "GB/s", "bf16 TFLOP/s", "fp32 TFLOP/s", "source"],
                 [[peaks.device, peaks.mem_gbps, peaks.bf16_tflops, peaks.fp32_tflops, peaks.source]])
    output.table("datasheet", ["GPU", "GB/s", "bf16 TFLOP/s", "fp32 TFLOP/s"],
                 [[k, *v] for k, v in DATASHEET.items()])


def register(app: typer.Typer) -> None:
    app.command("info")(info)
