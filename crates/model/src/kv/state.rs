//! A sequence's recurrent state beside its KV rows: a fixed-size state per
//! recurrent layer, and checkpoints of it at chosen positions, within a
//! byte budget (what each slot operation means for it:
//! `docs/dev/sequence-state.md`).

use std::collections::VecDeque;

use crate::config::Config;
use crate::error::ModelError;

/// Every recurrent layer's state of one sequence (an empty vector for an
/// attention layer), for layers `0..n`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct States(pub(crate) Vec<Vec<f32>>);

impl States {
    /// Zero states for the first `n_layers` layers of `c`; allocations are
    /// fallible (the sizes come from the file).
    pub fn zeros(c: &Config, n_layers: usize) -> Result<Self, ModelError> {
        let mut v = Vec::new();
        v.try_reserve_exact(n_layers)
            .map_err(|_| ModelError::Alloc {
                bytes: n_layers as u64 * 24,
            })?;
        for il in 0..n_layers {
            let len = c.state_len(il);
            let mut s = Vec::new();
            s.try_reserve_exact(len).map_err(|_| ModelError::Alloc {
                bytes: len as u64 * 4,
            })?;
            s.resize(len, 0.0);
            v.push(s);
        }
        Ok(States(v))
    }

    /// Whether any layer has a state.
    pub fn any(&self) -> bool {
        self.0.iter().any(|s| !s.is_empty())
    }

    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|s| s.len() as u64 * 4).sum()
    }

    pub fn clear(&mut self) {
        self.0.iter_mut().for_each(|s| s.fill(0.0));
    }

    /// Layer `il`'s state.
    pub(crate) fn layer(&self, il: usize) -> &[f32] {
        &self.0[il]
    }

    pub(crate) fn layer_mut(&mut self, il: usize) -> &mut [f32] {
        &mut self.0[il]
    }

    /// Takes `other`'s values (the same shapes).
    fn copy_from(&mut self, other: &States) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            a.copy_from_slice(b);
        }
    }

    /// Appends the states' values, a layer at a time.
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        for s in &self.0 {
            let bytes: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
            super::put_run(out, &bytes);
        }
    }

    /// Reads [`States::save`]'s bytes into these states (the same shapes).
    pub(crate) fn restore(&mut self, data: &mut &[u8]) -> Option<()> {
        for s in &mut self.0 {
            let run = super::take_run(data)?;
            if run.len() != s.len() * 4 {
                return None;
            }
            for (v, b) in s.iter_mut().zip(run.chunks_exact(4)) {
                *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Some(())
    }
}

/// Copies of a sequence's recurrent states at positions, oldest first,
/// within `budget` bytes: a new one pushes out the oldest until it fits,
/// and one larger than the whole budget is not kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoints {
    list: VecDeque<(usize, States)>,
    bytes: u64,
    budget: u64,
}

impl Checkpoints {
    pub fn new(budget: u64) -> Self {
        Checkpoints {
            budget,
            ..Checkpoints::default()
        }
    }

    /// Keeps a copy of `states` at position `pos`, replacing any at `pos`
    /// or after it (a sequence's history past `pos` is no longer its own).
    pub fn take(&mut self, pos: usize, states: &States) {
        // Position 0 is the zero state: nothing to keep.
        if pos == 0 {
            return;
        }
        self.forget_after(pos - 1);
        let need = states.bytes();
        if need == 0 || need > self.budget {
            return;
        }
        while self.bytes + need > self.budget {
            match self.list.pop_front() {
                Some((_, s)) => self.bytes -= s.bytes(),
                None => break,
            }
        }
        self.bytes += need;
        self.list.push_back((pos, states.clone()));
    }

    /// Drops the checkpoints after position `pos`.
    pub fn forget_after(&mut self, pos: usize) {
        while self.list.back().is_some_and(|(p, _)| *p > pos) {
            if let Some((_, s)) = self.list.pop_back() {
                self.bytes -= s.bytes();
            }
        }
    }

    pub fn clear(&mut self) {
        self.list.clear();
        self.bytes = 0;
    }

    /// The newest checkpoint at or before `pos`.
    pub fn at_or_before(&self, pos: usize) -> Option<(usize, &States)> {
        self.list
            .iter()
            .rev()
            .find(|(p, _)| *p <= pos)
            .map(|(p, s)| (*p, s))
    }

    /// Restores `states` from the newest checkpoint at or before `pos` and
    /// drops the later ones; returns its position (0, with zero states,
    /// where there is none).
    pub fn rewind(&mut self, pos: usize, states: &mut States) -> usize {
        self.forget_after(pos);
        match self.list.back() {
            Some((p, s)) => {
                states.copy_from(s);
                *p
            }
            None => {
                states.clear();
                0
            }
        }
    }

    /// Positions held, oldest first.
    pub fn positions(&self) -> Vec<usize> {
        self.list.iter().map(|(p, _)| *p).collect()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Appends the checkpoints: their count, then each position and states.
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.list.len() as u64).to_le_bytes());
        for (p, s) in &self.list {
            out.extend_from_slice(&(*p as u64).to_le_bytes());
            s.save(out);
        }
    }

    /// Reads [`Checkpoints::save`]'s bytes, each checkpoint shaped as
    /// `shape`; keeps what the budget holds.
    pub(crate) fn restore(&mut self, data: &mut &[u8], shape: &States) -> Option<()> {
        self.clear();
        let count = take_u64(data)?;
        for _ in 0..count {
            let pos = usize::try_from(take_u64(data)?).ok()?;
            let mut s = shape.clone();
            s.restore(data)?;
            self.take(pos, &s);
        }
        Some(())
    }

    /// Takes `other`'s checkpoints at or before `pos`.
    pub(crate) fn copy_until(&mut self, other: &Checkpoints, pos: usize) {
        self.clear();
        for (p, s) in other.list.iter().filter(|(p, _)| *p <= pos) {
            self.take(*p, s);
        }
    }
}

fn take_u64(data: &mut &[u8]) -> Option<u64> {
    let (n, rest) = data.split_first_chunk::<8>()?;
    *data = rest;
    Some(u64::from_le_bytes(*n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(v: f32, len: usize) -> States {
        States(vec![vec![v; len], Vec::new()])
    }

    #[test]
    fn checkpoints_stay_within_their_budget_oldest_leaving_first() {
        // Each checkpoint: 10 values, 40 bytes; room for two.
        let mut c = Checkpoints::new(100);
        for (pos, v) in [(4, 1.0), (8, 2.0), (12, 3.0)] {
            c.take(pos, &states(v, 10));
            assert!(c.bytes() <= 100);
        }
        assert_eq!(c.positions(), [8, 12]);
        // Larger than the whole budget: not kept, nothing evicted.
        c.take(20, &states(9.0, 30));
        assert_eq!(c.positions(), [8, 12]);
        let mut s = states(0.0, 10);
        assert_eq!(c.rewind(10, &mut s), 8);
        assert_eq!(s, states(2.0, 10));
        assert_eq!(c.positions(), [8]);
        assert_eq!(c.rewind(7, &mut s), 0);
        assert_eq!(s, states(0.0, 10));
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn a_new_checkpoint_replaces_the_ones_at_or_after_it() {
        let mut c = Checkpoints::new(1000);
        c.take(4, &states(1.0, 2));
        c.take(9, &states(2.0, 2));
        c.take(6, &states(3.0, 2));
        assert_eq!(c.positions(), [4, 6]);
        assert_eq!(c.bytes(), 16);
    }

    #[test]
    fn checkpoints_survive_save_and_restore() {
        let mut c = Checkpoints::new(1000);
        c.take(3, &states(1.5, 4));
        c.take(7, &states(-2.0, 4));
        let mut out = Vec::new();
        c.save(&mut out);
        let mut back = Checkpoints::new(1000);
        let mut data = &out[..];
        back.restore(&mut data, &states(0.0, 4)).unwrap();
        assert!(data.is_empty());
        assert_eq!(back, c);
        // Cut short: refused, never a panic.
        let mut data = &out[..out.len() - 3];
        assert!(back.restore(&mut data, &states(0.0, 4)).is_none());
    }
}
