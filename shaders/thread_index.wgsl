// thread_index: the flat index of a thread of a 64-wide workgroup in a dispatch split over (x, y) above
// 65535 workgroups a dimension (pyapp.gpu.kernels.shared.thread_groups).

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}
