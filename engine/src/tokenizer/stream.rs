//! Streaming detokenization: turn ids into text as they arrive, for SSE.
//!
//! One token may end in the middle of a multi-byte UTF-8 char (byte-level BPE
//! splits emoji and CJK across tokens). [`StreamDecoder`] keeps such a tail
//! until the char is complete, so every emitted chunk is valid text and the
//! concatenation of all chunks equals `decode` of all ids. Bytes that can
//! never become valid UTF-8 are emitted as U+FFFD, exactly as `decode` does.

use super::bpe_model::Tokenizer;

/// Incremental detokenizer for one sequence. `finish` consumes it.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    skip_special: bool,
}

impl StreamDecoder {
    /// A decoder; with `skip_special`, control tokens produce no text.
    pub fn new(skip_special: bool) -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            skip_special,
        }
    }

    /// Feed one id; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        if self.skip_special && tokenizer.is_special(id) {
            return String::new();
        }
        if let Some(bytes) = tokenizer.token_bytes(id) {
            self.pending.extend_from_slice(bytes);
        }
        self.drain_complete()
    }

    /// Flush what is left (an incomplete char becomes U+FFFD).
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }

    /// Whether bytes are held back waiting for the rest of a char.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid_end = start + e.valid_up_to();
                    // The prefix up to valid_end was just checked as UTF-8.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match e.error_len() {
                        // Incomplete char at the end: wait for more bytes.
                        None => {
                            start = valid_end;
                            break;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start = valid_end + bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::bpe_model::tests::tiny;
    use super::*;

    #[test]
    fn multibyte_chars_are_held_until_complete() {
        let t = tiny();
        let ids = t.encode("a🚀b東", false);
        // Byte-level pieces: the rocket is 4 single-byte tokens in this vocabulary.
        let mut dec = StreamDecoder::new(false);
        let chunks: Vec<String> = ids.iter().map(|&id| dec.push(&t, id)).collect();
        assert!(!dec.has_pending());
        assert_eq!(chunks.concat() + &dec.finish(), "a🚀b東");
        assert_eq!(chunks[0], "a");
        assert_eq!(chunks[1..4], ["", "", ""]);
        assert_eq!(chunks[4], "🚀");
    }

    #[test]
    fn invalid_bytes_become_replacement_chars_like_decode() {
        let t = tiny();
        let byte =
            |b: u8| t.token_id(&super::super::bpe::byte_to_char_table()[b as usize].to_string());
        let ids: Vec<u32> = [0xFFu8, b'x', 0xE6, 0x9D]
            .iter()
            .filter_map(|&b| byte(b))
            .collect();
        assert_eq!(ids.len(), 4);
        let mut dec = StreamDecoder::new(false);
        let mut text: String = ids.iter().map(|&id| dec.push(&t, id)).collect();
        assert!(dec.has_pending());
        text.push_str(&dec.finish());
        assert_eq!(text, t.decode(&ids));
        assert_eq!(text, "\u{FFFD}x\u{FFFD}");
    }

    #[test]
    fn specials_can_be_skipped() {
        let t = tiny();
        let ids = t.encode("<|im_start|>hello", true);
        let mut dec = StreamDecoder::new(true);
        let text: String = ids.iter().map(|&id| dec.push(&t, id)).collect();
        assert_eq!(text + &dec.finish(), "hello");
    }
}
