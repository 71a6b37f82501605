//! Stop sequences over streamed text.
//!
//! Text arrives in chunks; a stop string may straddle chunks. [`StopMatcher`]
//! releases text only once it cannot be the start of a stop string, and on a
//! match returns the text before it (the stop string itself is never sent,
//! as in OpenAI's API).

/// What one push produced.
#[derive(Debug, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to send now.
    pub text: String,
    /// A stop string was found; generation should end.
    pub stopped: bool,
}

/// Finds the first stop string in a stream of text chunks.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Append a chunk; return what may be released.
    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if self.stops.is_empty() {
            return StopOutput {
                text: chunk.to_owned(),
                stopped: false,
            };
        }
        self.held.push_str(chunk);
        // Earliest match wins; among matches at the same position, any ends it.
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return StopOutput {
                text,
                stopped: true,
            };
        }
        let keep_from = self.partial_match_start();
        let text = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        StopOutput {
            text,
            stopped: false,
        }
    }

    /// Release whatever is held (the stream ended without a match).
    pub fn finish(self) -> String {
        self.held
    }

    /// Start of the longest suffix of `held` that is a proper prefix of a stop string.
    fn partial_match_start(&self) -> usize {
        for (i, _) in self.held.char_indices() {
            let tail = &self.held[i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                return i;
            }
        }
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for c in chunks {
            let o = m.push(c);
            out.push_str(&o.text);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_inside_one_chunk_truncates_before_it() {
        assert_eq!(run(&["\n\n"], &["Paris.\n\nNext"]), ("Paris.".into(), true));
    }

    #[test]
    fn stop_across_chunks_is_found_and_partial_text_is_held() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abcE").text, "abc");
        assert_eq!(m.push("N").text, "");
        let o = m.push("Dxyz");
        assert_eq!(
            o,
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(
            run(&["END"], &["a", "E", "N", "D", "b"]),
            ("a".into(), true)
        );
    }

    #[test]
    fn false_partial_matches_are_released() {
        assert_eq!(
            run(&["END"], &["abE", "Nx", "yE"]),
            ("abENxyE".into(), false)
        );
        assert_eq!(run(&[], &["x", "y"]), ("xy".into(), false));
        assert_eq!(run(&[""], &["x"]), ("x".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_is_safe() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&["東京"], &["é東", "京!"]), ("é".into(), true));
        assert_eq!(run(&["東京"], &["é東", "x"]), ("é東x".into(), false));
    }
}
