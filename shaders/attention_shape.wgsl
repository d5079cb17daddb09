// attention_shape: the shape every attention kernel takes (pyapp.gpu.kernels.attention_constants):
// H query heads over HKV KV heads (query head h reads KV head h / (H / HKV)), HD floats a head, KV
// caches of CTX slots (position j in slot j % CTX), scores scaled by SCALE. The includer adds its
// mask's own override (WINDOW: a sliding window, 0 none; the canvas's KEEP).

override H: u32;
override HKV: u32;
override HD: u32;
override CTX: u32;
override SCALE: f32 = 1.0;

const NEG: f32 = -3.0e38;      // a score below any real one: a masked key, a softmax not yet started
