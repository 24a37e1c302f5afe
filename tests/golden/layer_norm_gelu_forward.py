# nvFusion0: 24 prims, emitted by remat
#   inputs:  x: f32[2, 4, 8], w: f32[8]
#   outputs: t87: f32[2, 4, 8], t100: f32[2, 4, 8], t106: f32[2, 4, 8], t124: f32[2, 4, 8], t132: f32[]
import torch
from nvfuser_direct import DataType, FusionDefinition


def nvFusion0(fd: FusionDefinition) -> None:
    x = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False, stride_order=[2, 1, 0])
    w = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False, stride_order=[0])
    v0 = fd.ops.var_mean(x, [2], 0)
    t35 = v0[0]
    t36 = v0[1]
    t51 = fd.ops.broadcast_in_dim(t35, [2, 4, 1], [0, 1])
    t56 = fd.ops.broadcast_in_dim(t36, [2, 4, 1], [0, 1])
    s0 = fd.define_scalar(1e-05, DataType.Double)
    t65 = fd.ops.add(t51, s0)
    t67 = fd.ops.rsqrt(t65)
    t72 = fd.ops.broadcast_in_dim(t56, [2, 4, 8], [0, 1, 2])
    t78 = fd.ops.sub(x, t72)
    t81 = fd.ops.broadcast_in_dim(t67, [2, 4, 8], [0, 1, 2])
    t87 = fd.ops.mul(t78, t81)
    t91 = fd.ops.broadcast_in_dim(w, [2, 4, 8], [2])
    t96 = fd.ops.mul(t87, t91)
    s1 = fd.define_scalar(1.4142135623730951, DataType.Double)
    t106 = fd.ops.mul(t96, fd.ops.reciprocal(s1))
    t113 = fd.ops.erf(t106)
    s2 = fd.define_scalar(0.5, DataType.Double)
    t120 = fd.ops.mul(s2, t113)
    s3 = fd.define_scalar(0.5, DataType.Double)
    t124 = fd.ops.add(s3, t120)
    t126 = fd.ops.mul(t96, t124)
    t131 = fd.ops.sum(t126, [0, 1, 2])
    fd.add_output(t87)
    fd.add_output(t96)
    fd.add_output(t106)
    fd.add_output(t124)
    fd.add_output(t131)


with FusionDefinition() as fd:
    nvFusion0(fd)

if __name__ == "__main__":
    inputs = [
        torch.randn((2, 4, 8), dtype=torch.float32, device="cuda"),
        torch.randn((8,), dtype=torch.float32, device="cuda"),
    ]
    outputs = fd.execute(inputs)
    print([tuple(o.shape) for o in outputs])
