//! Token choice for `lamina run`: greedy at temperature 0, otherwise
//! top-k → top-p → min-p → temperature → a seeded draw (llama.cpp's default
//! chain order, without penalties).

pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    state: u64,
}

impl Sampler {
    pub fn new(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> Self {
        Self {
            temperature,
            top_k,
            top_p,
            min_p,
            // splitmix64 of the seed, so seeds 0 and 1 start far apart.
            state: seed.wrapping_add(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let argmax = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &l)| if l > b.1 { (i, l) } else { b },
            )
            .0 as u32;
        if self.temperature <= 0.0 || self.top_k == 1 {
            return argmax;
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.top_k > 0 {
            cand.truncate(self.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| f64::from(c.1 - max).exp()).collect();
        let sum: f64 = probs.iter().sum();
        let mut keep = probs.len();
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p / sum;
                if acc >= f64::from(self.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.min_p > 0.0 {
            let floor = f64::from(self.min_p) * probs[0];
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        cand.truncate(keep);
        probs.clear();
        probs.extend(
            cand.iter()
                .map(|c| f64::from((c.1 - max) / self.temperature).exp()),
        );
        let total: f64 = probs.iter().sum();
        let mut r = self.next_f64() * total;
        for (c, p) in cand.iter().zip(&probs) {
            if r < *p {
                return c.0;
            }
            r -= p;
        }
        cand.last().map_or(argmax, |c| c.0)
    }
}
