// The mat-vec's activations as they are (NORM = off): see xnorm_on.wgsl.

fn norm_prologue(li: u32) {}

fn xn4(i: u32, k: u32, c: u32) -> vec4<f32> {
    return x4(i);
}

fn xn1(i: u32, k: u32, c: u32) -> f32 {
    return x1(i);
}
