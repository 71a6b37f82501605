//! Tokenizer and chat template built from the reference GGUF, checked against
//! golden ids from an independent implementation.
//!
//! Golden ids come from Hugging Face `tokenizers` 0.23.3 (Python), with a BPE
//! model built from this GGUF's `tokenizer.ggml.tokens` / `merges` (read with
//! the `gguf` 0.19 package), pre-tokenizer
//! `Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]`
//! and the token_type 3 tokens added as special tokens. The model file is
//! found via `KVFABRIC_MODEL_PATH` or the default cache path.

use kvfabric_testkit::engine::driver as common;

use common::model_path;

use kvfabric_engine::chat::{ChatMessage, ChatTemplate};
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::tokenizer::{PreTokenizerKind, StreamDecoder, Tokenizer};

fn load() -> (GgufFile, Tokenizer) {
    let gguf = GgufFile::open(&model_path()).expect("reference GGUF opens");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer builds from GGUF metadata");
    (gguf, tokenizer)
}

/// (text, ids) pairs; specials parsed.
const GOLDEN: &[(&str, &[u32])] = &[
    ("Hello", &[19556]),
    ("Hello world", &[19556, 905]),
    (" Hello", &[38699]),
    ("  leading spaces", &[216, 2899, 5600]),
    (
        "The year 2024 had 366 days.",
        &[
            504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 30,
        ],
    ),
    ("3.14159", &[35, 30, 33, 36, 33, 37, 41]),
    (
        "x=12345+678",
        &[104, 45, 33, 34, 35, 36, 37, 27, 38, 39, 40],
    ),
    (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        &[
            1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
        ],
    ),
    ("line1\n\nline2\n", &[1311, 33, 198, 198, 1311, 34, 198]),
    (
        "tabs\tand  double  spaces   end  ",
        &[100, 7366, 197, 397, 216, 5561, 216, 5600, 256, 1112, 256],
    ),
    (
        "don't you've I'll we'd THEY'RE",
        &[
            12420, 982, 346, 3543, 339, 3060, 392, 6737, 6462, 73, 23, 3256,
        ],
    ),
    (
        "naïve café — 東京 🚀 ¹²³",
        &[
            3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 15107, 244, 218, 216, 43183,
            19133, 39050,
        ],
    ),
    ("<|im_end|>\nHi", &[2, 198, 26843]),
    ("a\n b", &[81, 198, 278]),
    (
        "    def f(x):\n        return x**2\n",
        &[333, 753, 275, 24, 104, 727, 448, 1003, 1792, 828, 34, 198],
    ),
    (
        "<|im_start|>user\n\n  Hi<|im_end|>",
        &[1, 4093, 8866, 21041, 2],
    ),
    ("Ġx", &[143, 250, 104]),
    ("<|im_start|", &[44, 108, 306, 79, 3738, 108]),
    ("<|im_start|><|im_end|><|endoftext|>", &[1, 2, 0]),
];

#[test]
fn metadata_is_read_from_the_gguf() {
    let (_, t) = load();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.pre_tokenizer(), PreTokenizerKind::Smollm);
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert!(!t.add_bos());
    assert_eq!(t.stop_token_ids(), vec![0, 2]);
    assert!(t.is_special(1) && !t.is_special(17));
    // candle's fallback adds a prefix space (`Hello` -> `ĠHello`): we must not.
    assert_eq!(t.token_text(t.encode("Hello", false)[0]), Some("Hello"));
}

#[test]
fn golden_ids_match_the_reference_tokenizer() {
    let (_, t) = load();
    for (text, ids) in GOLDEN {
        assert_eq!(t.encode(text, true), *ids, "encoding {text:?}");
        assert_eq!(t.decode(ids), *text, "decoding {text:?}");
    }
}

#[test]
fn specials_are_text_when_not_allowed() {
    let (_, t) = load();
    let ids = t.encode("<|im_start|>user", false);
    assert!(!ids.contains(&1), "{ids:?}");
    assert_eq!(t.decode(&ids), "<|im_start|>user");
}

/// A 7.6k-token text, compared with the reference by length and a position-weighted sum.
#[test]
fn a_long_prompt_matches_the_reference() {
    let (_, t) = load();
    let text: String = (0..200)
        .map(|i| {
            format!(
                "Line {i}: the quick brown fox jumps over {} lazy dogs;  naïve café 東京 🚀\t'tis THEY'LL\n",
                i * 7919 % 1000
            )
        })
        .collect();
    let ids = t.encode(&text, true);
    assert_eq!(
        ids[..12],
        [11907, 216, 32, 42, 260, 2365, 6354, 16438, 27003, 690, 216, 32]
    );
    let weighted = ids.iter().enumerate().fold(0u64, |h, (p, &id)| {
        h.wrapping_add(id as u64 * (p as u64 + 1))
    });
    assert_eq!((ids.len(), weighted), (7664, 204303124338));
    assert_eq!(t.decode(&ids), text);
}

#[test]
fn round_trip_and_streaming_decode_are_exact() {
    let (_, t) = load();
    let samples = [
        "Emoji 🚀🚀 and CJK 東京都 and combining e\u{301} and \u{0} nul",
        "  \n\n\t  trailing   ",
        "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>",
        "1234567890 ¼ ½ ¾ ١٢٣",
    ];
    for s in samples {
        for parse_special in [true, false] {
            let ids = t.encode(s, parse_special);
            assert_eq!(t.decode(&ids), s);
            let mut dec = StreamDecoder::new(false);
            let mut streamed = String::new();
            for &id in &ids {
                let chunk = dec.push(&t, id);
                streamed.push_str(&chunk);
            }
            streamed.push_str(&dec.finish());
            assert_eq!(streamed, s);
        }
    }
}

#[test]
fn chat_template_from_the_gguf_renders_the_smollm2_prompt() {
    let (gguf, t) = load();
    let template = ChatTemplate::from_gguf(&gguf, &t).expect("template compiles");
    let prompt = template
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .expect("renders");
    assert_eq!(
        t.encode(&prompt, true),
        [
            1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
            407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
            520, 9531, 198
        ]
    );
}
