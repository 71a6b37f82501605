//! The default order against LRU on the generated traces, without a model
//! file: the traces of `bench eviction` tokenized one byte per token (the
//! bench itself needs the reference model's tokenizer). Ignored by default
//! (minutes in a dev build); run with
//! `cargo test -p kvfabric-benches --release default_order_is_never_below_lru -- --ignored --nocapture`.

#[cfg(test)]
mod tests {
    use kvfabric_store::{EvictionPolicy, KeyChain, ModelFingerprint, NodeConfig};

    use super::super::replay::{replay, small_layout};
    use super::super::traces::{self, Shape};

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    /// Seeds 1-3 of the five generated traces (bench defaults, but 12
    /// sessions and 1000 scan prompts: byte tokens are ~4x the model's), at
    /// the node's watermarks and at 1.0 / 1.0: `adaptive` and `door` against
    /// LRU at 5-75% of the distinct blocks. Fails if `adaptive` is below LRU.
    #[test]
    #[ignore]
    fn default_order_is_never_below_lru() {
        let layout = small_layout(64);
        let chain = KeyChain::new(b"bench-eviction", &ModelFingerprint([7; 32]), &layout);
        let mut below = Vec::new();
        for seed in 1..=3 {
            let shape = Shape {
                sessions: 12,
                turns: 8,
                system_tokens: 1000,
                history_tokens: 1500,
                answer_tokens: 48,
                scan_prompts: 1000,
                seed,
            };
            for t in traces::all(&bytes, &chain, &shape) {
                for (high, low) in [(0.95, 0.85), (1.0, 1.0)] {
                    let base = NodeConfig {
                        high_watermark: high,
                        low_watermark: low,
                        ..Default::default()
                    };
                    for frac in [0.05, 0.1, 0.25, 0.5, 0.75] {
                        let cap = ((t.capacity_base as f64 * frac) as usize).max(1);
                        let r = |p| replay(&t, layout, &base, p, Some(cap)).unwrap().ratio();
                        let (lru, ad, door) = (
                            r(EvictionPolicy::Lru),
                            r(EvictionPolicy::Adaptive),
                            r(EvictionPolicy::Door),
                        );
                        println!(
                            "seed {seed} {:<9} wm {high}/{low} {:>3.0}%: lru {lru:.4} adaptive {ad:.4} ({:.3}) door {door:.4} ({:.3})",
                            t.name,
                            frac * 100.0,
                            ad / lru.max(f64::MIN_POSITIVE),
                            door / lru.max(f64::MIN_POSITIVE)
                        );
                        if ad < lru {
                            below.push(format!("seed {seed} {} {high}/{low} {frac}", t.name));
                        }
                    }
                }
            }
        }
        assert!(below.is_empty(), "adaptive below LRU at {below:?}");
    }
}
