//! Per peer, whether READs of KV blocks travel encoded (`wire_compression`):
//! a batch's plan, from the measured link against the codec's speeds.
//!
//! Under `auto` the first batches go raw and measure the link (wire bytes
//! per second of batches of at least [`MIN_SAMPLE_BYTES`], a moving
//! average). Then a [`Model`] of the pipeline as the code runs it (the
//! server encodes slice i+1 while slice i is on the wire and the client
//! decodes slice i-1) says whether encoding beats raw by [`MARGIN`]. Once
//! encoded batches have run, their measured rate (raw bytes they stood for
//! per second) against the raw rate decides instead: measurement beats the
//! model. Every [`PROBE_EVERY`]th eligible batch goes the other way to keep
//! both rates fresh (a raw probe while encoding; an encoded one while raw,
//! only when the model says the codec could pay on this link). A decision
//! that flips is logged at debug and shown in `wire_compressing{peer}`.

use std::sync::Mutex;
use std::time::Duration;

use super::wire::{CodecSpeeds, Speed};
use crate::config::WireCompression;
use crate::core::{lock, PreparedOp};
use crate::metrics::{PeerLabels, TransferMetrics};
use crate::op::OpKind;

/// Encoding must be modelled this much faster than raw to be chosen.
pub(crate) const MARGIN: f64 = 0.10;
/// Measured encoded rate must beat the raw rate by this much.
const MEASURED_MARGIN: f64 = 0.03;
/// One eligible batch in this many is a probe (sent the other way).
pub(crate) const PROBE_EVERY: u64 = 16;
/// Batches moving fewer wire bytes are latency, not throughput: not sampled.
pub(crate) const MIN_SAMPLE_BYTES: u64 = 512 << 10;
/// Weight of a new sample in the per-peer rates.
const ALPHA: f64 = 0.3;

/// The pipeline of one batch, per byte rates (bytes per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Model {
    /// The link, wire bytes per second.
    pub link: f64,
    /// The peer's encoder and this node's decoder, raw bytes per second.
    pub encode: f64,
    pub decode: f64,
    /// Raw bytes per wire byte.
    pub ratio: f64,
}

impl Model {
    /// Seconds to move `bytes` raw.
    pub fn raw_secs(&self, bytes: u64) -> f64 {
        bytes as f64 / self.link
    }

    /// Seconds to move `bytes` in `slices` encoded slices: the first slice
    /// passes encode, wire and decode in turn; each later one adds the
    /// slowest of the three stages (they overlap slice by slice).
    pub fn encoded_secs(&self, bytes: u64, slices: u64) -> f64 {
        let n = slices.max(1) as f64;
        let s = bytes as f64 / n;
        let e = s / self.encode;
        let w = s / self.ratio.max(1e-3) / self.link;
        let d = s / self.decode;
        e + w + d + (n - 1.0) * e.max(w).max(d)
    }

    /// Whether encoding is modelled at least [`MARGIN`] faster than raw.
    pub fn pays(&self, bytes: u64, slices: u64) -> bool {
        self.encoded_secs(bytes, slices) < self.raw_secs(bytes) * (1.0 - MARGIN)
    }
}

/// What a batch asks of its hinted READs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    /// Hinted READs ask for their slices encoded.
    pub encode: bool,
    /// Element width of the batch's first hinted READ (0: none).
    pub width: u8,
}

/// What one batch's READs measured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    /// READ payload bytes on the wire, and the bytes they stand for.
    pub wire: u64,
    pub raw: u64,
    /// Whether any slice of the batch arrived encoded.
    pub encoded: bool,
    pub elapsed: Duration,
}

/// The per-peer figures the decision is made from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Rates {
    /// Raw batches: wire bytes per second (the link).
    pub link: Option<f64>,
    /// Encoded batches: raw bytes they stood for per second.
    pub encoded: Option<f64>,
}

/// Whether to encode, from the rates and the model's verdict: measured
/// rates, once both exist, decide; until then the model does.
pub(crate) fn decide(rates: Rates, model_pays: bool) -> bool {
    match (rates.link, rates.encoded) {
        (Some(link), Some(enc)) => enc > link * (1.0 + MEASURED_MARGIN),
        (Some(_), None) => model_pays,
        (None, _) => false,
    }
}

#[derive(Default)]
struct State {
    rates: Rates,
    encoding: bool,
    eligible: u64,
}

impl State {
    /// `auto`'s plan for a batch of `bytes` in `slices` hinted slices.
    fn auto(
        &mut self,
        speed: Speed,
        bytes: u64,
        slices: u64,
        peer: &str,
        metrics: &TransferMetrics,
    ) -> bool {
        let Some(link) = self.rates.link else {
            return false;
        };
        let model = Model {
            link,
            encode: speed.encode,
            decode: speed.decode,
            ratio: speed.ratio,
        };
        let now = decide(self.rates, model.pays(bytes, slices));
        if now != self.encoding {
            tracing::debug!(
                %peer, encode = now, link_bytes_per_s = link,
                encoded_bytes_per_s = ?self.rates.encoded, ?model,
                "wire compression decision flipped"
            );
            self.encoding = now;
            show(metrics, peer, now);
        }
        self.eligible += 1;
        let probe_due = self.eligible % PROBE_EVERY == 0;
        let sample_model = Model {
            ratio: speed.sample_ratio,
            ..model
        };
        let probe = probe_due && (now || sample_model.pays(bytes, slices));
        now != probe
    }
}

/// Show the decision for `peer` in `wire_compressing`.
fn show(metrics: &TransferMetrics, peer: &str, encoding: bool) {
    let label = PeerLabels {
        peer: peer.to_string(),
    };
    metrics
        .wire_compressing
        .get_or_create(&label)
        .set(encoding as i64);
}

/// One peer's wire-compression state.
#[derive(Default)]
pub(crate) struct PeerWire {
    state: Mutex<State>,
}

/// The hinted READs of a batch: (element width of the first, bytes, slices).
fn hinted(ops: &[PreparedOp], slice_bytes: u64) -> Option<(u8, u64, u64)> {
    let mut width = None;
    let (mut bytes, mut slices) = (0u64, 0u64);
    for p in ops.iter().filter(|p| asks_encoded(p, true)) {
        width.get_or_insert(p.op.element_width);
        bytes += p.op.len;
        slices += p.op.len.div_ceil(slice_bytes.max(1));
    }
    width.map(|w| (w, bytes, slices))
}

/// Whether `p`'s slices ask for encoding in a batch whose plan (and link)
/// says `encode`: READs that name a width the codec takes (2 or 4).
pub(crate) fn asks_encoded(p: &PreparedOp, encode: bool) -> bool {
    encode && p.op.kind == OpKind::Read && matches!(p.op.element_width, 2 | 4)
}

fn ewma(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o + ALPHA * (new - o))
}

impl PeerWire {
    /// The plan of a batch of `ops` to `peer` under `policy`.
    pub fn plan(
        &self,
        policy: WireCompression,
        speeds: &CodecSpeeds,
        ops: &[PreparedOp],
        slice_bytes: u64,
        peer: &str,
        metrics: &TransferMetrics,
    ) -> Plan {
        let Some((width, bytes, slices)) = hinted(ops, slice_bytes) else {
            return Plan::default();
        };
        let encode = match policy {
            WireCompression::Off => false,
            WireCompression::Always => {
                show(metrics, peer, true);
                true
            }
            WireCompression::Auto => {
                // The codec is timed (once per width) only when a link has
                // been measured, so engines that never meet one never pay.
                let mut st = lock(&self.state);
                st.rates.link.is_some()
                    && speeds
                        .get(width)
                        .is_some_and(|speed| st.auto(speed, bytes, slices, peer, metrics))
            }
        };
        Plan { encode, width }
    }

    /// Fold in what a batch measured. Raw batches measure the link; encoded
    /// ones their own rate, and a lower bound of the link (their wire bytes
    /// crossed it in that time).
    pub fn observe(&self, s: Sample) {
        let secs = s.elapsed.as_secs_f64();
        if s.wire < MIN_SAMPLE_BYTES || secs <= 0.0 {
            return;
        }
        let wire_rate = s.wire as f64 / secs;
        let mut st = lock(&self.state);
        if s.encoded {
            st.rates.encoded = Some(ewma(st.rates.encoded, s.raw as f64 / secs));
            st.rates.link = Some(st.rates.link.map_or(wire_rate, |l| l.max(wire_rate)));
        } else {
            st.rates.link = Some(ewma(st.rates.link, wire_rate));
        }
    }

    /// The rates measured so far.
    #[cfg(test)]
    fn rates(&self) -> Rates {
        lock(&self.state).rates
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SegmentId, SharedRegion, TransferOp};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;
    /// The codec on the engine's f16 blocks, roughly (docs/BENCHMARKS.md).
    fn model(link_gbit: f64) -> Model {
        Model {
            link: link_gbit * 1e9 / 8.0,
            encode: 1.5e9,
            decode: 2.0e9,
            ratio: 1.16,
        }
    }

    #[test]
    fn slow_links_encode_fast_links_stay_raw() {
        let (bytes, slices) = (24 * MIB, 24);
        assert!(model(1.0).pays(bytes, slices), "1 Gbit/s");
        assert!(model(2.5).pays(bytes, slices), "2.5 Gbit/s");
        assert!(!model(10.0).pays(bytes, slices), "10 Gbit/s");
        assert!(!model(100.0).pays(bytes, slices), "100 Gbit/s");
        // Incompressible data never pays, however slow the link.
        let flat = Model {
            ratio: 1.0,
            ..model(0.1)
        };
        assert!(!flat.pays(bytes, slices));
        // One slice cannot overlap its stages: encode + wire + decode in
        // turn, which a 1 Gbit/s link does not pay for at this ratio.
        assert!(!model(1.0).pays(MIB, 1));
        // The modelled time is the slowest stage once the pipeline is full.
        let m = model(1.0);
        let per = MIB as f64 / 1.16 / m.link;
        let t = m.encoded_secs(100 * MIB, 100);
        assert!((t / (100.0 * per) - 1.0).abs() < 0.02, "{t}");
    }

    #[test]
    fn measured_rates_overrule_the_model() {
        let link = Some(100e6);
        assert!(!decide(Rates::default(), true), "no link measured yet");
        assert!(decide(
            Rates {
                link,
                encoded: None
            },
            true
        ));
        assert!(!decide(
            Rates {
                link,
                encoded: None
            },
            false
        ));
        let slower = Rates {
            link,
            encoded: Some(90e6),
        };
        assert!(!decide(slower, true), "encoding measured slower");
        let faster = Rates {
            link,
            encoded: Some(115e6),
        };
        assert!(decide(faster, false), "encoding measured faster");
        let within_noise = Rates {
            link,
            encoded: Some(102e6),
        };
        assert!(!decide(within_noise, true));
    }

    fn engine_speeds() -> CodecSpeeds {
        CodecSpeeds::fixed(Speed {
            encode: 1.5e9,
            decode: 2.0e9,
            ratio: 1.16,
            sample_ratio: 1.16,
        })
    }

    fn read_ops(width: u8, n: u64) -> Vec<PreparedOp> {
        let local = Arc::new(SharedRegion::create("choice", (n * MIB) as usize).unwrap());
        (0..n)
            .map(|i| PreparedOp {
                op: TransferOp::read(SegmentId(1), i * MIB, SegmentId(2), i * MIB, MIB)
                    .with_element_width(width),
                local: local.clone(),
            })
            .collect()
    }

    fn sample(wire: u64, raw: u64, encoded: bool, millis: u64) -> Sample {
        Sample {
            wire,
            raw,
            encoded,
            elapsed: Duration::from_millis(millis),
        }
    }

    #[test]
    fn plans_follow_policy_hints_and_the_measured_link() {
        let speeds = engine_speeds();
        let m = TransferMetrics::default();
        let plan = |w: &PeerWire, policy, ops: &[PreparedOp]| {
            w.plan(policy, &speeds, ops, MIB, "p", &m).encode
        };
        let wire = PeerWire::default();
        let ops = read_ops(2, 24);
        let unhinted = read_ops(0, 24);
        assert!(!plan(&wire, WireCompression::Off, &ops));
        assert!(plan(&wire, WireCompression::Always, &ops));
        assert!(!plan(&wire, WireCompression::Always, &unhinted));
        assert!(!plan(&wire, WireCompression::Auto, &ops), "link unmeasured");
        // Small batches are not samples.
        wire.observe(sample(4096, 4096, false, 1));
        assert_eq!(wire.rates(), Rates::default());
        // A 100 MB/s link: encoding is modelled to pay.
        wire.observe(sample(24 * MIB, 24 * MIB, false, 252));
        assert!(plan(&wire, WireCompression::Auto, &ops));
        assert!(!plan(&wire, WireCompression::Auto, &unhinted));
        // Encoded batches measured slower than raw: back to raw.
        wire.observe(sample(20 * MIB, 24 * MIB, true, 400));
        assert!(!plan(&wire, WireCompression::Auto, &ops));
        assert!(wire.rates().link.unwrap() >= 99e6);
        // A 10 GB/s link: raw (as measured and as modelled).
        let fast = PeerWire::default();
        fast.observe(sample(24 * MIB, 24 * MIB, false, 2));
        assert!(!plan(&fast, WireCompression::Auto, &ops));
        assert_eq!(
            m.wire_compressing
                .get_or_create(&PeerLabels { peer: "p".into() })
                .get(),
            0
        );
    }

    #[test]
    fn every_sixteenth_eligible_batch_probes_the_other_way() {
        let speeds = engine_speeds();
        let m = TransferMetrics::default();
        let ops = read_ops(2, 24);
        let slow = PeerWire::default();
        slow.observe(sample(24 * MIB, 24 * MIB, false, 252));
        let fast = PeerWire::default();
        fast.observe(sample(24 * MIB, 24 * MIB, false, 2));
        let mut raw_probes = 0;
        let mut encoded_on_fast = 0;
        for _ in 0..(PROBE_EVERY * 2) {
            let p = |w: &PeerWire| w.plan(WireCompression::Auto, &speeds, &ops, MIB, "p", &m);
            raw_probes += !p(&slow).encode as u32;
            encoded_on_fast += p(&fast).encode as u32;
        }
        assert_eq!(
            raw_probes, 2,
            "a raw probe per {PROBE_EVERY} while encoding"
        );
        assert_eq!(encoded_on_fast, 0, "no encoded probe where it cannot pay");
    }
}
