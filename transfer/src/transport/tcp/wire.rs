//! The block codec (`kvfabric-codec`) on the tcp wire: how a served READ
//! slice is encoded (only when that saves bytes), how an encoded reply is
//! decoded into the destination, and what the codec costs on this machine
//! ([`CodecSpeeds`]: encode and decode throughput and ratio per element
//! width), which the per-peer chooser (`choice.rs`) weighs against the link.
//!
//! The speeds are calibrated once per width, on first use, on a synthetic
//! KV-like sample (`kvfabric_codec::sample`), then follow live slices:
//! every encoded reply's decode time and every asked-for slice's ratio. The
//! peer's encode speed is taken to be this engine's (the same build on
//! like hardware): a peer cannot be timed from here.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvfabric_codec::{CodecError, DEFAULT_SEGMENT};

use crate::core::lock;

/// Bytes of the calibration sample (one default slice).
const CALIBRATION_BYTES: usize = 1 << 20;
/// Weight of a new observation in the moving averages.
const ALPHA: f64 = 0.25;

/// Encode `data` (elements of `width` bytes, 2 or 4) into `out` when that
/// saves bytes; false (send it raw) otherwise, for any other width, and
/// when the codec's sampled estimate says it would not shrink (random
/// bytes cost an estimate, not an encode).
pub(crate) fn encode_slice(data: &[u8], width: u8, out: &mut Vec<u8>) -> bool {
    if !matches!(width, 2 | 4) {
        return false;
    }
    let w = width as usize;
    if kvfabric_codec::estimate_encoded_len(data, w, DEFAULT_SEGMENT) >= data.len() {
        return false;
    }
    match kvfabric_codec::encode(data, w, out) {
        Ok(()) => out.len() < data.len(),
        Err(e) => {
            tracing::debug!(error = %e, "slice not encoded; sent raw");
            false
        }
    }
}

/// Decode the encoded slice `enc` into `dst`, which it must fill exactly.
pub(crate) fn decode_slice(enc: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    kvfabric_codec::decode(enc, dst)
}

/// What the codec costs for one element width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Speed {
    /// Encode throughput, bytes of raw data per second (one core).
    pub encode: f64,
    /// Decode throughput, bytes of raw data per second (one core).
    pub decode: f64,
    /// Raw bytes over wire bytes, followed on live slices (1.0 for data
    /// the server found incompressible and sent raw).
    pub ratio: f64,
    /// The ratio of the calibration sample: what the chooser assumes when
    /// it probes whether live data compresses again.
    pub sample_ratio: f64,
}

/// The codec's speeds per element width, shared by every peer of an engine.
#[derive(Default)]
pub(crate) struct CodecSpeeds {
    /// Index 0: width 2; index 1: width 4.
    widths: Mutex<[Option<Speed>; 2]>,
}

fn slot(width: u8) -> Option<usize> {
    match width {
        2 => Some(0),
        4 => Some(1),
        _ => None,
    }
}

fn ewma(old: f64, new: f64) -> f64 {
    old + ALPHA * (new - old)
}

impl CodecSpeeds {
    /// The speeds for `width` (calibrating them on first use: a few ms);
    /// None for a width the codec is not used with.
    pub fn get(&self, width: u8) -> Option<Speed> {
        let i = slot(width)?;
        let mut w = lock(&self.widths);
        Some(*w[i].get_or_insert_with(|| calibrate(width)))
    }

    /// Speeds fixed at `speed` for both widths (unit tests of the chooser).
    #[cfg(test)]
    pub fn fixed(speed: Speed) -> Self {
        CodecSpeeds {
            widths: Mutex::new([Some(speed), Some(speed)]),
        }
    }

    /// Fold in a batch's live figures for `width`: `raw` bytes of slices
    /// that asked for encoding arrived as `wire` bytes, and `decoded` bytes
    /// of them were decoded in `decode_time`.
    pub fn observe(&self, width: u8, raw: u64, wire: u64, decoded: u64, decode_time: Duration) {
        let Some(i) = slot(width) else {
            return;
        };
        let mut w = lock(&self.widths);
        let Some(s) = w[i].as_mut() else {
            return;
        };
        if raw > 0 && wire > 0 {
            s.ratio = ewma(s.ratio, raw as f64 / wire as f64);
        }
        let secs = decode_time.as_secs_f64();
        if decoded >= CALIBRATION_BYTES as u64 / 4 && secs > 0.0 {
            s.decode = ewma(s.decode, decoded as f64 / secs);
        }
    }
}

/// Time the codec on a synthetic KV-like sample of `width` (best of two
/// runs each way, after a warm-up encode).
fn calibrate(width: u8) -> Speed {
    let w = width as usize;
    let sample = kvfabric_codec::sample::kv_like(w, CALIBRATION_BYTES, 0x6b76_6662);
    let mut enc = Vec::new();
    let mut out = vec![0u8; sample.len()];
    let mut best = (f64::MAX, f64::MAX);
    let mut ok = kvfabric_codec::encode(&sample, w, &mut enc).is_ok();
    for _ in 0..2 {
        let t = Instant::now();
        ok &= kvfabric_codec::encode(&sample, w, &mut enc).is_ok();
        best.0 = best.0.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        ok &= kvfabric_codec::decode(&enc, &mut out).is_ok();
        best.1 = best.1.min(t.elapsed().as_secs_f64());
    }
    let n = sample.len() as f64;
    let ratio = if ok && !enc.is_empty() {
        n / enc.len() as f64
    } else {
        1.0
    };
    let speed = Speed {
        encode: n / best.0.max(1e-9),
        decode: n / best.1.max(1e-9),
        ratio,
        sample_ratio: ratio,
    };
    tracing::debug!(width, ?speed, "wire codec calibrated");
    speed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_like_slices_encode_and_decode_back_exactly() {
        for width in [2u8, 4] {
            let data = kvfabric_codec::sample::kv_like(width as usize, 300_000, 3);
            let mut enc = Vec::new();
            assert!(encode_slice(&data, width, &mut enc), "width {width}");
            assert!(enc.len() < data.len());
            let mut back = vec![0u8; data.len()];
            decode_slice(&enc, &mut back).unwrap();
            assert_eq!(back, data);
            // A destination of the wrong size is an error, not a panic.
            let mut short = vec![0u8; data.len() - 2];
            assert!(decode_slice(&enc, &mut short).is_err());
        }
    }

    #[test]
    fn random_bytes_and_unknown_widths_go_raw() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let noise: Vec<u8> = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut enc = Vec::new();
        assert!(!encode_slice(&noise, 2, &mut enc));
        let kv = kvfabric_codec::sample::kv_like(2, 100_000, 1);
        assert!(!encode_slice(&kv, 3, &mut enc));
        assert!(!encode_slice(&kv, 0, &mut enc));
    }

    #[test]
    fn corrupt_encoded_slices_are_errors_never_panics() {
        let data = kvfabric_codec::sample::kv_like(2, 200_000, 5);
        let mut enc = Vec::new();
        assert!(encode_slice(&data, 2, &mut enc));
        let mut dst = vec![0u8; data.len()];
        for at in [0, 5, 30, enc.len() / 2, enc.len() - 1] {
            let mut bad = enc.clone();
            bad[at] ^= 0x5a;
            // Either refused, or (a flipped bit in a raw plane) decoded to
            // other bytes: the checksum or MAC over the wire bytes is what
            // keeps such a slice out (client.rs verifies it first).
            let _ = decode_slice(&bad, &mut dst);
        }
        assert!(decode_slice(&enc[..enc.len() / 2], &mut dst).is_err());
        assert!(decode_slice(&[], &mut dst).is_err());
    }

    #[test]
    fn speeds_calibrate_once_then_follow_live_slices() {
        let speeds = CodecSpeeds::default();
        assert!(speeds.get(3).is_none());
        let s = speeds.get(2).unwrap();
        assert!(s.encode > 0.0 && s.decode > 0.0);
        assert!(s.ratio > 1.0, "the KV-like sample compresses: {}", s.ratio);
        assert_eq!(s.ratio, s.sample_ratio);
        // Incompressible live data (the server sent it raw) pulls the ratio to 1.
        for _ in 0..40 {
            speeds.observe(2, 1 << 20, 1 << 20, 0, Duration::ZERO);
        }
        let live = speeds.get(2).unwrap();
        assert!(live.ratio < 1.01, "{}", live.ratio);
        assert_eq!(live.sample_ratio, s.sample_ratio);
        assert_eq!(live.encode, s.encode, "encode speed is not re-timed");
        // A measured decode speed replaces the calibrated one over time.
        for _ in 0..40 {
            speeds.observe(2, 0, 0, 1 << 20, Duration::from_millis(10));
        }
        let d = speeds.get(2).unwrap().decode;
        assert!((d - 104_857_600.0).abs() < 1e6, "{d}");
        assert_eq!(
            speeds.get(4).unwrap().sample_ratio,
            speeds.get(4).unwrap().ratio
        );
    }
}
