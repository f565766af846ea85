//! Unit tests on hand-made logits.

use super::*;

fn cfg() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(42),
        ..SamplerConfig::default()
    }
}

fn sampler(c: SamplerConfig) -> Sampler {
    Sampler::new(c).unwrap()
}

/// Logits whose softmax is exactly `probs`.
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn counts(c: SamplerConfig, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut s = sampler(c);
    let mut n = vec![0; logits.len()];
    for _ in 0..draws {
        let mut l = logits.to_vec();
        n[s.sample(&mut l, &[]) as usize] += 1;
    }
    n
}

#[test]
fn greedy_picks_the_argmax_and_the_lowest_id_on_ties() {
    let mut s = sampler(SamplerConfig::greedy());
    assert_eq!(s.sample(&mut [0.1, 3.0, -2.0, 2.9], &[]), 1);
    assert_eq!(s.sample(&mut [1.0, 5.0, 5.0, 5.0], &[]), 1);
    assert_eq!(s.sample(&mut [f32::NAN, -1.0, f32::NAN], &[]), 1);
    assert_eq!(s.sample(&mut [], &[]), 0);
    let mut neg = sampler(SamplerConfig {
        temperature: -1.0,
        ..SamplerConfig::default()
    });
    assert_eq!(neg.sample(&mut [0.0, 0.5, 0.25], &[]), 1);
}

#[test]
fn top_k_one_equals_greedy() {
    let mut s = sampler(SamplerConfig { top_k: 1, ..cfg() });
    let mut state = 12345u64;
    for _ in 0..200 {
        let logits: Vec<f32> = (0..50)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 40) as f32 / 1e5
            })
            .collect();
        assert_eq!(s.sample(&mut logits.clone(), &[]), argmax(&logits));
    }
}

#[test]
fn top_k_keeps_exactly_k() {
    let logits = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    let n = counts(SamplerConfig { top_k: 2, ..cfg() }, &logits, 2000);
    assert!(n[0] > 0 && n[1] > 0 && n[2] == 0 && n[3] == 0, "{n:?}");
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
    // 0.5 < 0.75 <= 0.8: the first two.
    let n = counts(
        SamplerConfig {
            top_p: 0.75,
            ..cfg()
        },
        &logits,
        3000,
    );
    assert!(n[0] > 0 && n[1] > 0 && n[2] == 0 && n[3] == 0, "{n:?}");
    // Exactly reaching p stops there.
    let mut c: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
        })
        .collect();
    top_p(&mut c, 0.5);
    assert_eq!(c.len(), 1);
    // A tiny p still keeps one token.
    let n = counts(
        SamplerConfig {
            top_p: 1e-6,
            ..cfg()
        },
        &logits,
        200,
    );
    assert_eq!(n[0], 200);
}

#[test]
fn min_p_drops_tokens_below_the_fraction_of_the_top() {
    let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
    // Floor 0.2 × 0.5 = 0.1: 0.05 goes, 0.15 stays.
    let n = counts(
        SamplerConfig {
            min_p: 0.2,
            ..cfg()
        },
        &logits,
        4000,
    );
    assert!(n[2] > 0 && n[3] == 0, "{n:?}");
    let n = counts(
        SamplerConfig {
            min_p: 0.9,
            ..cfg()
        },
        &logits,
        500,
    );
    assert_eq!(n[0], 500);
}

#[test]
fn repeat_penalty_moves_away_from_recent_tokens() {
    let c = SamplerConfig {
        repeat_penalty: 1.2,
        ..SamplerConfig::greedy()
    };
    // Positive logit divided: 2.0 / 1.2 < 1.9.
    assert_eq!(sampler(c.clone()).sample(&mut [2.0, 1.9], &[0]), 1);
    // Negative logit multiplied: -1.0 × 1.2 < -1.1.
    assert_eq!(sampler(c.clone()).sample(&mut [-1.0, -1.1], &[0]), 1);
    // Without the token in history nothing changes.
    assert_eq!(sampler(c.clone()).sample(&mut [2.0, 1.9], &[5]), 0);
    // Only the last `repeat_last_n` tokens count.
    let short = SamplerConfig {
        repeat_last_n: 1,
        ..c.clone()
    };
    assert_eq!(sampler(short).sample(&mut [2.0, 1.9], &[0, 1]), 0);
    let all = SamplerConfig {
        repeat_last_n: -1,
        ..c
    };
    assert_eq!(sampler(all).sample(&mut [2.0, 1.9], &[0, 1, 1, 1]), 0);
}

#[test]
fn presence_and_frequency_penalties_subtract() {
    let presence = SamplerConfig {
        presence_penalty: 0.5,
        ..SamplerConfig::greedy()
    };
    let mut l = [1.0, 0.9];
    assert_eq!(sampler(presence).sample(&mut l, &[0, 0, 0]), 1);
    assert_eq!(l, [0.5, 0.9]);

    let frequency = SamplerConfig {
        frequency_penalty: 0.2,
        ..SamplerConfig::greedy()
    };
    assert_eq!(sampler(frequency.clone()).sample(&mut [1.0, 0.5], &[0]), 0);
    let mut l = [1.0, 0.5];
    assert_eq!(sampler(frequency).sample(&mut l, &[0, 0, 0]), 1);
    assert!((l[0] - 0.4).abs() < 1e-6);
}

#[test]
fn logit_bias_comes_first() {
    let ban = SamplerConfig {
        logit_bias: vec![(1, f32::NEG_INFINITY), (99, 5.0)],
        ..SamplerConfig::greedy()
    };
    assert_eq!(sampler(ban).sample(&mut [0.0, 3.0, 1.0], &[]), 2);
    let boost = SamplerConfig {
        logit_bias: vec![(0, 10.0)],
        ..cfg()
    };
    let n = counts(boost, &[0.0, 3.0, 1.0], 100);
    assert!(n[0] > 90, "{n:?}");
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let flat = vec![0.0f32; 1000];
    let run = |seed| {
        let mut s = sampler(SamplerConfig {
            seed: Some(seed),
            ..cfg()
        });
        (0..64)
            .map(|_| s.sample(&mut flat.clone(), &[]))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
    // Every token of a flat distribution is reachable.
    let distinct: std::collections::BTreeSet<_> = run(3).into_iter().collect();
    assert!(distinct.len() > 50);
}

#[test]
fn temperature_one_matches_softmax_frequencies() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    let draws = 10_000;
    let n = counts(cfg(), &logits_of(&probs), draws);
    let chi2: f64 = n
        .iter()
        .zip(probs)
        .map(|(&o, p)| {
            let e = p * draws as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum();
    // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
    assert!(chi2 < 16.27, "chi2 {chi2} for {n:?}");
}

#[test]
fn temperature_sharpens_and_flattens() {
    let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
    let cold = counts(
        SamplerConfig {
            temperature: 0.1,
            ..cfg()
        },
        &logits,
        2000,
    );
    // p^10 normalised: the top token has about 94.7 %.
    assert!(cold[3] > 1800, "{cold:?}");
    let hot = counts(
        SamplerConfig {
            temperature: 10.0,
            ..cfg()
        },
        &logits,
        4000,
    );
    assert!(hot.iter().all(|&c| c > 800), "{hot:?}");
}

#[test]
fn everything_banned_falls_back_to_argmax() {
    let mut s = sampler(cfg());
    assert_eq!(s.sample(&mut [f32::NEG_INFINITY; 3], &[]), 0);
}

#[test]
fn invalid_configs_name_the_field() {
    let bad = [
        (
            SamplerConfig {
                top_p: 0.0,
                ..cfg()
            },
            "top_p",
        ),
        (
            SamplerConfig {
                top_p: 1.5,
                ..cfg()
            },
            "top_p",
        ),
        (
            SamplerConfig {
                top_p: f32::NAN,
                ..cfg()
            },
            "top_p",
        ),
        (
            SamplerConfig {
                min_p: -0.1,
                ..cfg()
            },
            "min_p",
        ),
        (
            SamplerConfig {
                temperature: f32::NAN,
                ..cfg()
            },
            "temperature",
        ),
        (
            SamplerConfig {
                repeat_penalty: 0.0,
                ..cfg()
            },
            "repeat_penalty",
        ),
        (
            SamplerConfig {
                repeat_last_n: -2,
                ..cfg()
            },
            "repeat_last_n",
        ),
        (
            SamplerConfig {
                presence_penalty: f32::INFINITY,
                ..cfg()
            },
            "presence_penalty",
        ),
        (
            SamplerConfig {
                frequency_penalty: f32::NAN,
                ..cfg()
            },
            "frequency_penalty",
        ),
        (
            SamplerConfig {
                logit_bias: vec![(3, f32::NAN)],
                ..cfg()
            },
            "logit_bias",
        ),
    ];
    for (c, field) in bad {
        let err = Sampler::new(c).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    assert!(SamplerConfig::default().validate().is_ok());
}

#[test]
fn top_logprobs_are_log_softmax() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
    let top = top_logprobs(&logits, 3);
    let lse = [1.0f64, 3.0, 2.0, 3.0]
        .iter()
        .map(|l| l.exp())
        .sum::<f64>()
        .ln();
    let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
    assert_eq!(ids, [1, 3, 2]);
    for (id, lp) in top {
        assert!((f64::from(lp) - (f64::from(logits[id as usize]) - lse)).abs() < 1e-6);
    }
    assert_eq!(top_logprobs(&logits, 10).len(), 4);
    assert!(top_logprobs(&logits, 0).is_empty());
    assert!(top_logprobs(&[], 3).is_empty());
}

/// The post-chain distribution is the softmax over what top-k, top-p and
/// min-p kept, at the temperature; the drawn token is the one `sample`
/// draws from the same state.
#[test]
fn post_sampling_probs_are_the_chains_distribution() {
    let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
    let c = SamplerConfig { top_k: 3, ..cfg() };
    let (mut a, mut b) = (sampler(c.clone()), sampler(c));
    for _ in 0..20 {
        let (id, p) = a.sample_with_probs(&mut logits.clone(), &[], 2);
        assert_eq!(id, b.sample(&mut logits.clone(), &[]));
        // Top-k 3 drops the last token; the rest renormalise.
        let want = [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95];
        assert_eq!(p.top.len(), 2);
        for (i, &(t, q)) in p.top.iter().enumerate() {
            assert_eq!(t, i as u32);
            assert!((f64::from(q) - want[i]).abs() < 1e-6, "{p:?}");
        }
        assert!(
            (f64::from(p.chosen) - want[id as usize]).abs() < 1e-6,
            "{p:?}"
        );
    }

    // Temperature 0.5 squares the probabilities before renormalising.
    let mut s = sampler(SamplerConfig {
        temperature: 0.5,
        ..cfg()
    });
    let (_, p) = s.sample_with_probs(&mut logits_of(&[0.75, 0.25]), &[], 5);
    assert_eq!(p.top.len(), 2);
    assert!(
        (p.top[0].1 - 0.9).abs() < 1e-6 && (p.top[1].1 - 0.1).abs() < 1e-6,
        "{p:?}"
    );

    // Greedy: the argmax, certainly.
    let mut g = sampler(SamplerConfig::greedy());
    let (id, p) = g.sample_with_probs(&mut [0.1, 3.0, -2.0], &[], 3);
    assert_eq!((id, p.chosen, p.top), (1, 1.0, vec![(1, 1.0)]));
}

#[test]
fn plain_greedy_is_the_raw_argmax_and_nothing_else_claims_it() {
    let logits = vec![0.5, 3.0, 2.9, -1.0];
    let history = [1, 1, 3];
    let greedy = SamplerConfig::greedy();
    // Penalties over a window of nothing move nothing.
    let no_window = SamplerConfig {
        repeat_penalty: 1.5,
        repeat_last_n: 0,
        ..greedy.clone()
    };
    for c in [greedy.clone(), no_window] {
        let mut s = sampler(c.clone());
        assert!(s.is_plain_greedy(), "{c:?}");
        assert_eq!(s.sample(&mut logits.clone(), &history), argmax(&logits));
    }
    // Each of these can pick another token than the raw argmax.
    for c in [
        SamplerConfig {
            repeat_penalty: 1.5,
            ..greedy.clone()
        },
        SamplerConfig {
            presence_penalty: 0.5,
            ..greedy.clone()
        },
        SamplerConfig {
            frequency_penalty: 0.5,
            ..greedy.clone()
        },
        SamplerConfig {
            logit_bias: vec![(2, 1.0)],
            ..greedy.clone()
        },
    ] {
        let mut s = sampler(c.clone());
        assert!(!s.is_plain_greedy(), "{c:?}");
        assert_eq!(s.sample(&mut logits.clone(), &history), 2, "{c:?}");
    }
    assert!(!sampler(cfg()).is_plain_greedy());
}

/// The one-pass selection keeps exactly the candidates, in exactly the
/// order, that sorting every accepted logit and keeping the first `k`
/// gives: on ties, signed zeros, infinities and NaN, for `k` from 0 past
/// the vocabulary, and over vocabularies of many blocks, where whole
/// blocks are skipped against the worst kept logit (ties with it kept
/// where their id wins).
#[test]
fn best_equals_sorting_everything() {
    let mut rng = Xoshiro256::seed_from_u64(7);
    let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, -0.0];
    for n in [1usize, 2, 7, 100, 5000, 70_001] {
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                let u = rng.next_f64();
                if u < 0.1 {
                    specials[(rng.next_u64() % 5) as usize]
                } else {
                    // A coarse grid: many ties.
                    ((rng.next_f64() * 16.0).floor() - 8.0) as f32
                }
            })
            .collect();
        let sampled: fn(f32) -> bool = |l| !l.is_nan() && l != f32::NEG_INFINITY;
        let reported: fn(f32) -> bool = |l| !l.is_nan();
        let keeps = [("finite or +inf", sampled), ("not NaN", reported)];
        for (what, keep) in keeps {
            let mut all: Vec<Candidate> = logits
                .iter()
                .enumerate()
                .filter(|&(_, &l)| keep(l))
                .map(|(i, &logit)| Candidate {
                    id: i as u32,
                    logit,
                })
                .collect();
            all.sort_by(by_logit_desc);
            for k in [0, 1, 2, 40, n.saturating_sub(1), n, n + 5] {
                let want: Vec<(u32, u32)> = all
                    .iter()
                    .take(if k == 0 { usize::MAX } else { k })
                    .map(|c| (c.id, c.logit.to_bits()))
                    .collect();
                let got: Vec<(u32, u32)> = best(&logits, k, keep)
                    .iter()
                    .map(|c| (c.id, c.logit.to_bits()))
                    .collect();
                assert_eq!(got, want, "n {n}, k {k}, {what}");
            }
        }
    }
    // +0 ranks above -0: blocks of +0 after a heap of -0 are not skipped.
    let mut zeros = vec![-0.0f32; 200];
    zeros[130..].fill(0.0);
    let got: Vec<u32> = best(&zeros, 10, |l| !l.is_nan())
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(got, (130..140).collect::<Vec<u32>>());
}

/// Drawing from the best logits alone gives `sample`'s token and leaves the
/// random stream where `sample` leaves it: on ties, signed zeros,
/// infinities and NaN, rows of only -inf or NaN, with exactly the `top_k`
/// candidates and with more than it, step after step.
#[test]
fn sample_top_draws_what_sample_draws() {
    let mut rng = Xoshiro256::seed_from_u64(11);
    let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, -0.0];
    for (n, top_k, top_p, min_p, extra) in [
        (1000usize, 40usize, 0.95f32, 0.05f32, 0usize),
        (1000, 40, 0.95, 0.05, 17),
        (50, 64, 1.0, 0.0, 0),
        (3000, 1, 1.0, 0.0, 3),
        (5, 10, 0.5, 0.1, 0),
    ] {
        let c = SamplerConfig {
            temperature: 0.7,
            top_k,
            top_p,
            min_p,
            seed: Some(5),
            ..SamplerConfig::default()
        };
        let (mut whole, mut part) = (sampler(c.clone()), sampler(c));
        for step in 0..60 {
            let logits: Vec<f32> = (0..n)
                .map(|i| match step % 6 {
                    4 => f32::NEG_INFINITY,
                    5 if i % 2 == 0 => f32::NAN,
                    5 => f32::NEG_INFINITY,
                    // +inf (which makes every draw its first) in one step of six.
                    3 if rng.next_f64() < 0.05 => specials[(rng.next_u64() % 5) as usize],
                    _ if rng.next_f64() < 0.05 => {
                        [f32::NAN, f32::NEG_INFINITY, 0.0, -0.0][(rng.next_u64() % 4) as usize]
                    }
                    _ => ((rng.next_f64() * 96.0).floor() / 16.0 - 3.0) as f32,
                })
                .collect();
            let top = top_entries(&logits, top_k + extra);
            let want = whole.sample(&mut logits.clone(), &[]);
            assert_eq!(
                part.sample_top(&top),
                Ok(want),
                "n {n}, top_k {top_k}, step {step}"
            );
        }
    }
    // Only NaN: no entries, and 0 as `sample` gives.
    let mut s = sampler(SamplerConfig { top_k: 40, ..cfg() });
    assert!(top_entries(&[f32::NAN; 3], 40).is_empty());
    assert_eq!(s.sample_top(&[]), Ok(0));
}

#[test]
fn only_a_top_k_sampler_without_bias_or_penalties_draws_from_its_candidates() {
    let base = SamplerConfig { top_k: 40, ..cfg() };
    assert_eq!(sampler(base.clone()).top_k_only(), Some(40));
    let no = [
        SamplerConfig {
            top_k: 0,
            ..base.clone()
        },
        SamplerConfig {
            temperature: 0.0,
            ..base.clone()
        },
        SamplerConfig {
            logit_bias: vec![(3, 1.0)],
            ..base.clone()
        },
        SamplerConfig {
            repeat_penalty: 1.1,
            ..base.clone()
        },
        SamplerConfig {
            presence_penalty: 0.5,
            ..base.clone()
        },
    ];
    for c in no {
        let mut s = sampler(c.clone());
        assert_eq!(s.top_k_only(), None, "{c:?}");
        assert_eq!(s.sample_top(&[(1, 2.0)]), Err(SamplingError::NeedsLogits));
    }
    // Penalties that look at no token leave the logits alone.
    let off = SamplerConfig {
        repeat_penalty: 1.3,
        repeat_last_n: 0,
        ..base
    };
    assert_eq!(sampler(off).top_k_only(), Some(40));
}
