//! Choosing the next token from a logits vector, in the order of
//! llama.cpp's default sampler chain (`common/sampling.cpp`):
//! logit bias → repetition penalties → top-k → top-p → min-p → temperature
//! → a seeded draw from the softmax. Temperature ≤ 0 is greedy: the argmax
//! after bias and penalties, ties to the lowest id.
//!
//! Top-p and min-p see probabilities at temperature 1, as in llama.cpp,
//! where temperature comes after them. Candidates are ordered by logit and
//! then by id, so every step is deterministic for a given seed (llama.cpp's
//! unstable sorts and its mt19937 draws are not reproduced bit for bit).
//!
//! No GPU, no tokenizer: ids are indices into the logits slice.

mod error;
pub mod rng;

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

pub use error::SamplingError;
use rng::Xoshiro256;

/// Sampling parameters; the defaults are llama.cpp's (`common_params_sampling`).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// ≤ 0: greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens below `min_p` × the top token's probability; 0 keeps all.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of recent tokens; 1 is off.
    pub repeat_penalty: f32,
    /// How many of the latest history tokens the penalties look at; 0 is
    /// off, -1 is the whole history.
    pub repeat_last_n: i32,
    /// Subtracted once from the logit of any recent token.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of recent tokens.
    pub frequency_penalty: f32,
    /// `None`: seeded from the process's randomness.
    pub seed: Option<u64>,
    /// Added to a token's logit before anything else (-inf bans it).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinP(self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(SamplingError::RepeatPenalty(self.repeat_penalty));
        }
        if self.repeat_last_n < -1 {
            return Err(SamplingError::RepeatLastN(self.repeat_last_n));
        }
        if !self.presence_penalty.is_finite() {
            return Err(SamplingError::PresencePenalty(self.presence_penalty));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(SamplingError::FrequencyPenalty(self.frequency_penalty));
        }
        for &(token, bias) in &self.logit_bias {
            if bias.is_nan() || bias == f32::INFINITY {
                return Err(SamplingError::LogitBias { token, bias });
            }
        }
        Ok(())
    }
}

/// The distribution a token was drawn from, after the sampler chain.
#[derive(Clone, Debug, PartialEq)]
pub struct PostProbs {
    /// The drawn token's probability.
    pub chosen: f32,
    /// `(id, probability)` of the most likely tokens, most likely first,
    /// ties to the lowest id; none with probability 0.
    pub top: Vec<(u32, f32)>,
}

impl PostProbs {
    /// One token that could not have been anything else.
    fn certain(id: u32) -> Self {
        PostProbs {
            chosen: 1.0,
            top: vec![(id, 1.0)],
        }
    }
}

/// One sequence's sampler: the config and its random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Xoshiro256,
}

/// A token still in the running.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Descending logit, then ascending id; NaN sorts last.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    let key = |c: &Candidate| {
        if c.logit.is_nan() {
            f32::NEG_INFINITY
        } else {
            c.logit
        }
    };
    key(b).total_cmp(&key(a)).then(a.id.cmp(&b.id))
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self, SamplingError> {
        cfg.validate()?;
        let seed = cfg.seed.unwrap_or_else(random_seed);
        Ok(Self {
            cfg,
            rng: Xoshiro256::seed_from_u64(seed),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Whether every token this sampler picks is [`argmax`] of the raw
    /// logits: greedy, with no bias and no penalty that could move them.
    /// Such a sequence needs only the argmax, which a backend may reduce
    /// where the logits are (a GPU reads back one token, not the vocabulary).
    pub fn is_plain_greedy(&self) -> bool {
        let c = &self.cfg;
        c.temperature <= 0.0 && c.logit_bias.is_empty() && self.penalties_off()
    }

    /// `Some(top_k)` when every token this sampler draws depends only on the
    /// `top_k` best raw logits ([`top_entries`]): it samples (temperature
    /// above 0) with a top-k, and no bias or penalty moves a logit before
    /// the top-k cut. Such a sequence needs only those candidates, which a
    /// backend may select where the logits are (a GPU then reads back `k`
    /// pairs, not the vocabulary); [`Self::sample_top`] draws from them.
    pub fn top_k_only(&self) -> Option<usize> {
        let c = &self.cfg;
        (c.temperature > 0.0 && c.top_k > 0 && c.logit_bias.is_empty() && self.penalties_off())
            .then_some(c.top_k)
    }

    /// [`Self::sample`] from the best raw logits alone: `top` holds at
    /// least the first `min(top_k, n)` of [`top_entries`]' list for the
    /// step's logits (`n` the number that are not NaN), in its order; more
    /// is ignored. The same token and the same random stream as `sample`
    /// on the whole vector. Refused unless [`Self::top_k_only`].
    pub fn sample_top(&mut self, top: &[(u32, f32)]) -> Result<u32, SamplingError> {
        let Some(k) = self.top_k_only() else {
            return Err(SamplingError::NeedsLogits);
        };
        // `best`'s filter: NaN and -inf are never candidates.
        let cands: Vec<Candidate> = top
            .iter()
            .filter(|(_, l)| !l.is_nan() && *l != f32::NEG_INFINITY)
            .take(k)
            .map(|&(id, logit)| Candidate { id, logit })
            .collect();
        if cands.is_empty() {
            // Every logit NaN or -inf: `sample`'s fallback, the argmax,
            // which is the lowest id of the -inf (the list's first), or 0.
            return Ok(top.first().map_or(0, |&(id, _)| id));
        }
        Ok(self.chain(cands, None).0)
    }

    /// Whether the penalties leave every logit as it is.
    fn penalties_off(&self) -> bool {
        let c = &self.cfg;
        c.repeat_last_n == 0
            || (c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0)
    }

    /// Picks the next token. `logits` is modified in place by the bias and
    /// penalties; `history` is the sequence so far (prompt and generated),
    /// oldest first. An empty `logits` gives 0.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.sample_inner(logits, history, None).0
    }

    /// [`Self::sample`], also reporting the distribution the token was
    /// drawn from (after the whole chain) and its `n` most likely tokens:
    /// llama-server's `post_sampling_probs`. The draw is the same as
    /// `sample`'s for the same state.
    pub fn sample_with_probs(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        n: usize,
    ) -> (u32, PostProbs) {
        let (id, probs) = self.sample_inner(logits, history, Some(n));
        (id, probs.unwrap_or_else(|| PostProbs::certain(id)))
    }

    fn sample_inner(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        report: Option<usize>,
    ) -> (u32, Option<PostProbs>) {
        self.apply_bias(logits);
        self.apply_penalties(logits, history);
        // Greedy: the argmax is the only token that can come out.
        let certain = |id| (id, report.map(|_| PostProbs::certain(id)));
        if self.cfg.temperature <= 0.0 {
            return certain(argmax(logits));
        }

        let cands = best(logits, self.cfg.top_k, |l| {
            !l.is_nan() && l != f32::NEG_INFINITY
        });
        if cands.is_empty() {
            // Everything banned: fall back to the (penalised) argmax.
            return certain(argmax(logits));
        }
        self.chain(cands, report)
    }

    /// The chain after top-k: top-p, min-p, temperature and the draw, over
    /// candidates in [`by_logit_desc`] order (at least one).
    fn chain(
        &mut self,
        mut cands: Vec<Candidate>,
        report: Option<usize>,
    ) -> (u32, Option<PostProbs>) {
        top_p(&mut cands, self.cfg.top_p);
        min_p(&mut cands, self.cfg.min_p);
        for c in &mut cands {
            c.logit /= self.cfg.temperature;
        }
        let id = self.draw(&cands);
        let probs = report.map(|n| {
            // Still sorted by logit: the chain only truncates, and a
            // positive temperature keeps the order.
            let p = softmax(&cands);
            let chosen = cands
                .iter()
                .zip(&p)
                .find(|(c, _)| c.id == id)
                .map_or(0.0, |(_, &q)| q as f32);
            let top = cands
                .iter()
                .zip(&p)
                .take(n)
                .map(|(c, &q)| (c.id, q as f32))
                // What rounds to nothing was not a possible draw.
                .filter(|&(_, q)| q > 0.0)
                .collect();
            PostProbs { chosen, top }
        });
        (id, probs)
    }

    fn apply_bias(&self, logits: &mut [f32]) {
        for &(id, bias) in &self.cfg.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
    }

    /// llama.cpp's `penalties` sampler over the last `repeat_last_n` tokens.
    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        if self.penalties_off() {
            return;
        }
        let c = &self.cfg;
        let window = match usize::try_from(c.repeat_last_n) {
            Ok(n) => &history[history.len().saturating_sub(n)..],
            Err(_) => history,
        };
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in window {
            *counts.entry(t).or_default() += 1;
        }
        for (&id, &count) in &counts {
            let Some(l) = logits.get_mut(id as usize) else {
                continue;
            };
            // Dividing a negative logit would raise it, so those are multiplied.
            if *l <= 0.0 {
                *l *= c.repeat_penalty;
            } else {
                *l /= c.repeat_penalty;
            }
            *l -= count as f32 * c.frequency_penalty + c.presence_penalty;
        }
    }

    /// A draw from the softmax of the candidates' logits.
    fn draw(&mut self, cands: &[Candidate]) -> u32 {
        let max = cands
            .iter()
            .map(|c| c.logit)
            .fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = cands
            .iter()
            .map(|c| f64::from(c.logit - max).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let first = cands.first().map_or(0, |c| c.id);
        if !(total.is_finite() && total > 0.0) {
            return first;
        }
        let mut u = self.rng.next_f64() * total;
        for (c, w) in cands.iter().zip(&weights) {
            if u < *w {
                return c.id;
            }
            u -= w;
        }
        // Rounding left u just above the last weight.
        cands.last().map_or(first, |c| c.id)
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is keyed from the OS's randomness once per process and
    // advanced per instance: enough for an unseeded request.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6C61_6D69_6E61);
    h.finish()
}

/// The highest logit, ties to the lowest id, NaN ignored; 0 when empty.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// The `k` best of the logits that `keep` accepts (all of them for `k`
/// 0), in [`by_logit_desc`] order: the top-k sampler's candidates.
///
/// One pass over the vocabulary with a heap of `k`, not a candidate per
/// token and a selection over them: most logits lose one float compare
/// against the worst kept, so Gemma 3's 262144 cost a scan, not a 2 MiB
/// vector and a partition, each step of each sequence. The order is total
/// (ties go to the lower id), so the set and its order are those of
/// sorting every candidate.
fn best(logits: &[f32], k: usize, keep: impl Fn(f32) -> bool) -> Vec<Candidate> {
    if k == 0 || k >= logits.len() {
        let mut cands: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .filter(|&(_, &l)| keep(l))
            .map(|(i, &logit)| Candidate {
                id: i as u32,
                logit,
            })
            .collect();
        cands.sort_unstable_by(by_logit_desc);
        return cands;
    }
    // A max-heap under by_logit_desc: its top is the worst kept.
    let mut heap: BinaryHeap<Ranked> = BinaryHeap::with_capacity(k);
    // Once the heap is full, the worst kept logit: anything below it is
    // out, so a block whose kept logits all are is skipped after one pass
    // that the compiler vectorises (a 262144-token vocabulary is otherwise
    // a heap comparison per token, most of a sampled step's host time).
    let mut floor: Option<f32> = None;
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        if let Some(f) = floor {
            let max = block_max(block, &keep);
            // Strictly below: an equal float may still rank above the
            // worst in the total order (+0 over -0). (A true tie loses:
            // its id is later than every kept one.)
            if max < f {
                continue;
            }
        }
        for (j, &logit) in block.iter().enumerate() {
            if !keep(logit) {
                continue;
            }
            let c = Candidate {
                id: (b * BLOCK + j) as u32,
                logit,
            };
            if heap.len() < k {
                heap.push(Ranked(c));
                if heap.len() == k {
                    floor = heap.peek().map(|w| w.0.logit);
                }
                continue;
            }
            // A smaller float is worse in the total order too (no NaN here
            // that `keep` let through is compared before by_logit_desc).
            if floor.is_some_and(|f| logit < f) {
                continue;
            }
            let Some(mut worst) = heap.peek_mut() else {
                continue;
            };
            if by_logit_desc(&c, &worst.0) == Ordering::Less {
                *worst = Ranked(c);
                drop(worst);
                floor = heap.peek().map(|w| w.0.logit);
            }
        }
    }
    heap.into_sorted_vec().into_iter().map(|r| r.0).collect()
}

/// Logits [`best`] checks against its floor at once.
const BLOCK: usize = 64;

/// The largest logit of `block` that `keep` accepts (a kept NaN counts as
/// +inf, so its block is never skipped), in eight lanes of plain compares
/// and selects, which the compiler turns into vector instructions where
/// `f32::max`'s NaN rules would keep it scalar.
fn block_max(block: &[f32], keep: &impl Fn(f32) -> bool) -> f32 {
    let lane = |l: f32| match (keep(l), l.is_nan()) {
        (false, _) => f32::NEG_INFINITY,
        (true, true) => f32::INFINITY,
        (true, false) => l,
    };
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = block.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &l) in acc.iter_mut().zip(c) {
            let v = lane(l);
            *a = if v > *a { v } else { *a };
        }
    }
    for (a, &l) in acc.iter_mut().zip(tail) {
        let v = lane(l);
        *a = if v > *a { v } else { *a };
    }
    acc.into_iter()
        .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

/// A candidate ordered by [`by_logit_desc`] (best first, so a max-heap
/// keeps the worst on top).
struct Ranked(Candidate);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// Probabilities at temperature 1 of candidates sorted by logit.
fn softmax(cands: &[Candidate]) -> Vec<f64> {
    let max = cands.first().map_or(0.0, |c| f64::from(c.logit));
    let exps: Vec<f64> = cands
        .iter()
        .map(|c| (f64::from(c.logit) - max).exp())
        .collect();
    let total: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / total).collect()
}

/// Keeps the shortest prefix whose probability reaches `p` (at least one).
fn top_p(cands: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    let probs = softmax(cands);
    let mut cum = 0.0;
    for (i, q) in probs.iter().enumerate() {
        cum += q;
        if cum >= f64::from(p) {
            cands.truncate(i + 1);
            return;
        }
    }
}

/// Keeps tokens whose probability is at least `p` × the top one's.
fn min_p(cands: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 {
        return;
    }
    let Some(top) = cands.first().map(|c| c.logit) else {
        return;
    };
    // p_i >= p * p_max  ⇔  logit_i >= logit_max + ln p.
    let floor = top + p.ln();
    let keep = cands.iter().take_while(|c| c.logit >= floor).count().max(1);
    cands.truncate(keep);
}

/// The `k` best logits with their ids, best first: higher first in IEEE
/// total order (+0 above -0), ties to the lower id, NaN left out (-inf
/// kept, last). What [`Sampler::sample_top`] draws from, and what a
/// backend that selects them where the logits are must give.
pub fn top_entries(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    best(logits, k, |l| !l.is_nan())
        .into_iter()
        .map(|c| (c.id, c.logit))
        .collect()
}

/// The `n` most likely tokens of a logits vector with their log-probability
/// (logit − logsumexp over the whole vocabulary, in f64), most likely first,
/// ties to the lowest id: what the API's `logprobs` reports.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let finite = logits.iter().filter(|l| !l.is_nan());
    let max = finite.clone().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if n == 0 || max == f32::NEG_INFINITY {
        return Vec::new();
    }
    let lse = f64::from(max)
        + finite
            .map(|&l| (f64::from(l) - f64::from(max)).exp())
            .sum::<f64>()
            .ln();
    best(logits, n, |l| !l.is_nan())
        .into_iter()
        .take(n)
        .map(|c| (c.id, (f64::from(c.logit) - lse) as f32))
        .collect()
}

#[cfg(test)]
mod tests;
