// A dispatch over one matrix (RUNS = off): workgroup column chunks as the
// kernel lays them out, and no shift into the weight.

const RUNS_ON: bool = false;

fn run_setup(z: u32) -> u32 {
    return 0u;
}
