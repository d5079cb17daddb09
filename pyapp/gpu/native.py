"""Native backend: wgpu-native through the `wgpu` package (CPython only)."""

from __future__ import annotations

import time

import wgpu

from . import LIMIT_NAMES, Device, GPUError, Plan

_USAGE = {
    "storage": wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC,
    "uniform": wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST,
    "readback": wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
    "indirect": wgpu.BufferUsage.INDIRECT | wgpu.BufferUsage.COPY_DST,
}


class NativeDevice(Device):
    backend = "native"

    @classmethod
    def create(cls, power_preference: str = "high-performance") -> "NativeDevice":
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        except Exception as e:  # wgpu raises various types when no driver is present
            raise GPUError(f"no WebGPU adapter (install a Vulkan/Metal/D3D12 driver, "
                           f"e.g. mesa-vulkan-drivers for lavapipe): {e}") from e
        if adapter is None:
            raise GPUError("no WebGPU adapter found")
        return cls(adapter)

    def __init__(self, adapter):
        super().__init__()
        self.adapter = adapter
        avail = set(adapter.features)
        # wgpu-native spells the subgroup feature 'subgroup'; the WebGPU spec 'subgroups'.
        want = [f for f in ("shader-f16", "subgroups", "subgroup", "timestamp-query") if f in avail]
        limits = {k: v for k, v in adapter.limits.items()
                  if k in {n.replace("_", "-") for n in LIMIT_NAMES}}
        self.device = adapter.request_device_sync(required_features=want, required_limits=limits)
        self.queue = self.device.queue
        self.features = {("subgroups" if f == "subgroup" else f) for f in want}
        self.limits = {k.replace("-", "_"): int(v) for k, v in self.device.limits.items()}
        info = adapter.info
        self.info = {k: info.get(k, "") for k in ("vendor", "architecture", "device", "description",
                                                   "adapter_type", "backend_type")}

    def enables(self, *exts):
        # naga enables subgroup ops with the device feature and rejects `enable subgroups;`
        return super().enables(*(e for e in exts if e != "subgroups"))

    def _create_buffer(self, size, kind, label):
        return self.device.create_buffer(size=size, usage=_USAGE[kind], label=label)

    def _write(self, buf, offset, data):
        self.queue.write_buffer(buf.handle, offset, data)

    def _create_pipeline(self, source, entry, constants, label):
        try:
            module = self.device.create_shader_module(code=source, label=label)
            stage = {"module": module, "entry_point": entry}
            if constants:
                stage["constants"] = constants
            return self.device.create_compute_pipeline(layout="auto", compute=stage, label=label)
        except Exception as e:
            raise GPUError(f"pipeline {label}: {e}") from e

    def _create_bind_group(self, pipeline, entries):
        layout = pipeline.handle.get_bind_group_layout(0)
        try:     # wgpu's own validation errors (a binding over the size limit) are ours to report
            return self.device.create_bind_group(layout=layout, entries=[
                {"binding": i, "resource": {"buffer": b.handle, "offset": off, "size": size}}
                for i, b, off, size in entries])
        except Exception as e:
            raise GPUError(f"bind group for {pipeline.label}: {e}") from e

    def _encode(self, plan: Plan, stamps=None, per_dispatch: bool = False):
        """A command buffer of the plan; with `stamps` = (timestamp query set, buffer to resolve it into)
        it writes the first pass's start and the last pass's end, or every dispatch in a pass of its own,
        its start and end."""
        enc = self.device.create_command_encoder()
        cpass = None
        last = max((i for i, op in enumerate(plan.ops) if op[0] == "d"), default=-1)
        q = 0
        for i, op in enumerate(plan.ops):
            if op[0] == "d":
                if cpass is None:
                    tw = None
                    if stamps is not None:
                        reaches_last = all(o[0] == "d" for o in plan.ops[i:last])
                        tw = {"query_set": stamps[0]}
                        if per_dispatch:
                            tw.update(beginning_of_pass_write_index=q, end_of_pass_write_index=q + 1)
                            q += 2
                        else:
                            if q == 0:
                                tw["beginning_of_pass_write_index"] = 0
                            if reaches_last:
                                tw["end_of_pass_write_index"] = 1
                            q = 2
                        if len(tw) == 1:     # a pass between the first and the last: no stamp
                            tw = None
                    cpass = enc.begin_compute_pass(timestamp_writes=tw) if tw else enc.begin_compute_pass()
                _, p, bg, x, y, z, indirect = op
                cpass.set_pipeline(p.handle)
                cpass.set_bind_group(0, bg.handle)
                if indirect is None:
                    cpass.dispatch_workgroups(x, y, z)
                else:
                    cpass.dispatch_workgroups_indirect(indirect[0].handle, indirect[1])
                if per_dispatch and stamps is not None:
                    cpass.end()
                    cpass = None
            else:
                if cpass is not None:
                    cpass.end()
                    cpass = None
                _, src, so, dst, do, n = op
                enc.copy_buffer_to_buffer(src.handle, so, dst.handle, do, n)
        if cpass is not None:
            cpass.end()
        if stamps is not None:
            enc.resolve_query_set(stamps[0], 0, stamps[0].count, stamps[1], 0)
        return enc.finish()

    def time_plan_gpu(self, plan, repeat=5, per_dispatch=False):
        if "timestamp-query" not in self.features:
            raise GPUError("this device has no timestamp queries")
        per = 2 * sum(op[0] == "d" for op in plan.ops) if per_dispatch else 2
        cpu, resolved = [], []
        for _ in range(repeat):
            stamps = (self.device.create_query_set(type=wgpu.QueryType.timestamp, count=per),
                      self.device.create_buffer(size=8 * per,
                                                usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC))
            t = time.perf_counter()
            self.queue.submit([self._encode(plan, stamps, per_dispatch)])
            cpu.append((time.perf_counter() - t) * 1e3)
            resolved.append(stamps[1])
        ns = []
        for res in resolved:
            ns += [int(v) for v in memoryview(self.queue.read_buffer(res)).cast("Q")]
        return {"cpu_ms": cpu, "ns": ns}

    def _submit(self, plan):
        self.queue.submit([self._encode(plan)])

    def read(self, buf, offset=0, size=None):
        size = buf.size - offset if size is None else size
        if offset % 4:
            raise GPUError(f"readback offset {offset} is not a multiple of 4")
        return bytes(self.queue.read_buffer(buf.handle, offset, (size + 3) & ~3))[:size]

    def read_mapped(self, buf, offset=0, size=None):
        size = buf.size - offset if size is None else size
        buf.handle.map_sync(wgpu.MapMode.READ, offset, size)
        try:
            return bytes(buf.handle.read_mapped(offset, size))
        finally:
            buf.handle.unmap()

    def sync(self) -> None:
        """Wait until the queue is idle (benchmarks)."""
        self.queue.read_buffer(self._sync_buffer(), 0, 4)

    def _sync_buffer(self):
        if not hasattr(self, "_syncbuf"):
            self._syncbuf = self.buffer(16, label="sync").handle
        return self._syncbuf

    def time_plan(self, plan: Plan, repeat: int = 10) -> float:
        """Seconds per submit of `plan` (wall clock, queue drained before and after)."""
        self.sync()
        t = time.perf_counter()
        for _ in range(repeat):
            self._submit(plan)
        self.sync()
        return (time.perf_counter() - t) / repeat
