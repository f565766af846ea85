// The second view of the weight buffer, as vec4 words, for decoders that
// load aligned 16-byte pieces (quant::binds_twice).
@group(0) @binding(3) var<storage, read> w4: array<vec4<u32>>;
