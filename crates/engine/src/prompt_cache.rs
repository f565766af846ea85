//! The host prompt cache (llama-server's `--cache-ram`): slots' caches kept
//! in host memory after the slot went to another request, so a
//! conversation that comes back resumes from its prefix instead of
//! prefilling it again.
//!
//! A server with fewer slots than conversations (a local app's one slot, a
//! chat server's four and forty users) loses each conversation's cache
//! whenever its slot takes another prompt, and the next turn prefills the
//! whole history again: seconds per turn on a CPU for a long chat. When a
//! slot is about to drop positions for a new request, the scheduler saves
//! them here ([`PromptCache::insert`], the backend's `save_cache` bytes);
//! when a request arrives, the entry that holds the longest start of its
//! prompt is restored into its slot if it beats what the slots hold
//! ([`PromptCache::best`]), and leaves the cache (the slot holds it now, and
//! saves it again when it moves on).
//!
//! The policy is llama-server's (`server_prompt_cache`), so the two
//! servers keep and pick the same prompts: an entry whose tokens another
//! entry already holds is not stored again, entries that the new one
//! contains go, the oldest go first when the limit is reached, one larger
//! than the limit is not stored, and a restore must keep at least a
//! quarter of an entry (a long cached history is not thrown away for a
//! short shared start).

use std::collections::VecDeque;

/// One saved cache: the tokens its positions hold, and the backend's bytes.
#[derive(Debug)]
pub(crate) struct Entry {
    pub tokens: Vec<u32>,
    pub state: Vec<u8>,
}

/// The fewest of an entry's tokens a restore must keep, as a fraction of
/// them (llama-server's 0.25).
const KEEP_MIN: f64 = 0.25;

#[derive(Debug)]
pub(crate) struct PromptCache {
    /// Oldest first.
    entries: VecDeque<Entry>,
    /// Bytes of state the entries may hold together.
    limit: u64,
    bytes: u64,
}

impl PromptCache {
    /// A cache of at most `limit` bytes of state (`u64::MAX`: no limit).
    pub fn new(limit: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            limit,
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of state held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of state per token over the entries held, `None` when empty:
    /// what the next save will likely take, asked before it is made.
    pub fn bytes_per_token(&self) -> Option<u64> {
        let tokens: usize = self.entries.iter().map(|e| e.tokens.len()).sum();
        (tokens > 0).then(|| self.bytes.div_ceil(tokens as u64))
    }

    /// Whether [`PromptCache::insert`] would keep `tokens`: some, and not a
    /// start of what an entry already holds. Asked before the backend
    /// reads the cache out, which is the costly part.
    pub fn wants(&self, tokens: &[u32]) -> bool {
        !tokens.is_empty()
            && !self
                .entries
                .iter()
                .any(|e| common_prefix(&e.tokens, tokens) == tokens.len())
    }

    /// Keeps `state` (the positions of `tokens`) as the newest entry: the
    /// entries whose tokens are a start of `tokens` go, then the oldest
    /// until it fits. `false`, with nothing changed, when it is not
    /// [`PromptCache::wants`]ed or is larger than the whole limit.
    pub fn insert(&mut self, tokens: Vec<u32>, state: Vec<u8>) -> bool {
        let size = state.len() as u64;
        if !self.wants(&tokens) || size > self.limit {
            return false;
        }
        self.entries.retain(|e| {
            let contained = common_prefix(&e.tokens, &tokens) == e.tokens.len();
            if contained {
                self.bytes -= e.state.len() as u64;
            }
            !contained
        });
        // size <= limit, checked above.
        self.evict_to(self.limit - size);
        self.bytes += size;
        self.entries.push_back(Entry { tokens, state });
        true
    }

    /// Lowers the limit to `limit` bytes, dropping the oldest entries until
    /// the rest fit (the host ran short of memory).
    pub fn shrink_to(&mut self, limit: u64) {
        self.limit = limit;
        self.evict_to(limit);
    }

    /// Drops the oldest entries until the rest hold at most `bytes`.
    fn evict_to(&mut self, bytes: u64) {
        while self.bytes > bytes {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= old.state.len() as u64;
        }
    }

    /// The entry to restore for `prompt` into a slot whose cache already
    /// holds `held` tokens, `kept` of them a start of `prompt`: the one
    /// that keeps the largest share of its own tokens among those that give
    /// a longer start than `kept`, as llama-server picks, and at least
    /// [`KEEP_MIN`] of its tokens. Its index and how many tokens of
    /// `prompt` it holds.
    pub fn best(&self, prompt: &[u32], kept: usize, held: usize) -> Option<(usize, usize)> {
        // An empty slot: any entry that passes KEEP_MIN beats it.
        let mut keep_best = if held == 0 {
            -1.0
        } else {
            kept as f64 / held as f64
        };
        let mut lcp_best = kept;
        let mut found = None;
        for (i, e) in self.entries.iter().enumerate() {
            let lcp = common_prefix(&e.tokens, prompt);
            let keep = lcp as f64 / e.tokens.len().max(1) as f64;
            if keep < KEEP_MIN {
                continue;
            }
            if keep > keep_best && lcp > lcp_best {
                keep_best = keep;
                lcp_best = lcp;
                found = Some((i, lcp));
            }
        }
        found
    }

    /// Takes entry `i` out (it is being restored into a slot).
    pub fn take(&mut self, i: usize) -> Option<Entry> {
        let e = self.entries.remove(i)?;
        self.bytes -= e.state.len() as u64;
        Some(e)
    }
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(r: std::ops::Range<u32>) -> Vec<u32> {
        r.collect()
    }

    #[test]
    fn an_entry_held_by_another_is_not_stored_and_a_contained_one_goes() {
        let mut c = PromptCache::new(1000);
        assert!(c.insert(toks(0..10), vec![0; 100]));
        // A start of what is held: nothing new.
        assert!(!c.wants(&toks(0..5)));
        assert!(!c.insert(toks(0..5), vec![0; 50]));
        assert!(!c.insert(Vec::new(), Vec::new()));
        // Its continuation replaces it.
        assert!(c.insert(toks(0..20), vec![0; 200]));
        assert_eq!((c.len(), c.bytes()), (1, 200));
        // Another prompt sits beside it.
        assert!(c.insert(toks(100..110), vec![0; 100]));
        assert_eq!((c.len(), c.bytes()), (2, 300));
    }

    #[test]
    fn the_oldest_go_to_make_room_and_an_oversized_entry_is_refused() {
        let mut c = PromptCache::new(300);
        assert!(c.insert(toks(0..10), vec![0; 100]));
        assert!(c.insert(toks(100..110), vec![0; 100]));
        assert!(c.insert(toks(200..210), vec![0; 100]));
        assert!(c.insert(toks(300..310), vec![0; 150]));
        // 0.. and 100.. went, oldest first.
        assert_eq!(c.bytes(), 250);
        assert_eq!(c.best(&toks(0..10), 0, 0), None);
        assert_eq!(c.best(&toks(100..110), 0, 0), None);
        assert_eq!(c.best(&toks(200..210), 0, 0), Some((0, 10)));
        assert!(!c.insert(toks(400..410), vec![0; 301]));
        assert_eq!((c.len(), c.bytes()), (2, 250));
        c.shrink_to(160);
        assert_eq!((c.len(), c.bytes()), (1, 150));
        assert_eq!(c.best(&toks(300..320), 0, 0), Some((0, 10)));
    }

    #[test]
    fn the_pick_beats_the_slot_and_keeps_a_quarter_of_itself() {
        let mut c = PromptCache::new(u64::MAX);
        // A long history, and a short prompt with the same start.
        let history = toks(0..100);
        c.insert(history.clone(), vec![1; 10]);
        c.insert(
            toks(0..8).into_iter().chain(500..510).collect(),
            vec![2; 10],
        );
        // A prompt sharing 20 of the history's 100 tokens: under a quarter
        // of it, so only the short entry (8 of 18) may serve.
        let prompt: Vec<u32> = toks(0..20).into_iter().chain(900..905).collect();
        assert_eq!(c.best(&prompt, 0, 0), Some((1, 8)));
        // The history's next turn: all of it kept.
        let next: Vec<u32> = history.iter().copied().chain(700..720).collect();
        assert_eq!(c.best(&next, 0, 0), Some((0, 100)));
        // A slot that already holds as long a start wins.
        assert_eq!(c.best(&next, 100, 100), None);
        // One that holds less of it, or keeps a smaller share of itself,
        // loses.
        assert_eq!(c.best(&next, 40, 60), Some((0, 100)));
        let e = c.take(0).unwrap();
        assert_eq!((e.tokens, e.state.len()), (history, 10));
        assert_eq!((c.len(), c.bytes()), (1, 10));
        assert!(c.take(5).is_none());
    }
}
