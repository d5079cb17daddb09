// GELU, tanh approximation, as reference.forward.gelu_tanh (Gemma's MLP activation).
// tanh's argument is clamped: some drivers compute it via exp and overflow to NaN.

fn tanh_safe(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}

fn gelu_tanh(g: f32) -> f32 {
    return 0.5 * g * (1.0 + tanh_safe(0.7978845608028654 * (g + 0.044715 * g * g * g)));
}
