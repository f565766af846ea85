// No RMSNorm after the product (NE = off): see norm_epi_on.wgsl.

fn norm_epilogue(li: u32, n_wg: u32) {}
