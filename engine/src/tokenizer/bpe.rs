//! GPT-2 byte-level BPE: the byte <-> printable-char table and the merge loop.
//!
//! A pre-token's bytes start as one symbol per byte (each byte's printable
//! stand-in is a vocabulary entry); adjacent pairs are merged lowest rank
//! first, leftmost first among equal ranks, until no pair has a merge. The
//! merge loop uses a min-heap of candidate pairs over a doubly linked symbol
//! list, so a pre-token of n bytes costs O(n log n) instead of O(n^2).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's `bytes_to_unicode`: every byte gets a printable char, so tokens
/// are valid strings. Printable Latin-1 maps to itself; the rest to U+0100...
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 0u32;
    for b in 0u32..256 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            let c = 256 + next_extra;
            next_extra += 1;
            c
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Merge table keyed by the pair of token ids.
#[derive(Debug)]
pub(crate) struct MergeTable {
    /// (left id, right id) -> (rank, merged id).
    pairs: HashMap<(u32, u32), (u32, u32)>,
    /// Token id of each single byte (its printable stand-in), if in the vocab.
    byte_ids: [Option<u32>; 256],
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    /// False once merged into its left neighbour.
    alive: bool,
}

impl MergeTable {
    /// Build from `"left right"` merge lines; merges whose parts or result are
    /// not in the vocabulary are skipped (they could never apply).
    pub(crate) fn new(vocab: &HashMap<String, u32>, merges: &[String]) -> MergeTable {
        let mut pairs = HashMap::with_capacity(merges.len());
        let mut merged = String::new();
        for (rank, line) in merges.iter().enumerate() {
            let Some((left, right)) = line.split_once(' ') else {
                continue;
            };
            merged.clear();
            merged.push_str(left);
            merged.push_str(right);
            if let (Some(&l), Some(&r), Some(&m)) = (
                vocab.get(left),
                vocab.get(right),
                vocab.get(merged.as_str()),
            ) {
                pairs.entry((l, r)).or_insert((rank as u32, m));
            }
        }
        let table = byte_to_char_table();
        let mut byte_ids = [None; 256];
        let mut buf = [0u8; 4];
        for (b, c) in table.iter().enumerate() {
            byte_ids[b] = vocab.get(&*c.encode_utf8(&mut buf)).copied();
        }
        MergeTable { pairs, byte_ids }
    }

    /// BPE-encode one pre-token's bytes, appending ids to `out`. Bytes with no
    /// vocabulary entry become `unknown_id`.
    pub(crate) fn encode_word(&self, bytes: &[u8], unknown_id: u32, out: &mut Vec<u32>) {
        if bytes.is_empty() {
            return;
        }
        let n = bytes.len();
        let mut symbols: Vec<Symbol> = bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| Symbol {
                id: self.byte_ids[b as usize].unwrap_or(unknown_id),
                prev: i.checked_sub(1),
                next: if i + 1 < n { Some(i + 1) } else { None },
                alive: true,
            })
            .collect();
        // Heap entries: (rank, left position, merged id); min-heap by rank then position.
        let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::new();
        for i in 0..n.saturating_sub(1) {
            if let Some(&(rank, merged)) = self.pairs.get(&(symbols[i].id, symbols[i + 1].id)) {
                heap.push(Reverse((rank, i, merged)));
            }
        }
        while let Some(Reverse((rank, pos, merged))) = heap.pop() {
            let left = symbols[pos];
            let Some(right_pos) = left.next else {
                continue;
            };
            if !left.alive {
                continue;
            }
            let right = symbols[right_pos];
            // Stale entry: one side changed since it was pushed.
            match self.pairs.get(&(left.id, right.id)) {
                Some(&(r, m)) if r == rank && m == merged => {}
                _ => continue,
            }
            symbols[pos].id = merged;
            symbols[pos].next = right.next;
            symbols[right_pos].alive = false;
            if let Some(after) = right.next {
                symbols[after].prev = Some(pos);
                if let Some(&(r, m)) = self.pairs.get(&(merged, symbols[after].id)) {
                    heap.push(Reverse((r, pos, m)));
                }
            }
            if let Some(before) = left.prev {
                if let Some(&(r, m)) = self.pairs.get(&(symbols[before].id, merged)) {
                    heap.push(Reverse((r, before, m)));
                }
            }
        }
        let mut cur = Some(0);
        while let Some(i) = cur {
            out.push(symbols[i].id);
            cur = symbols[i].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_with_gpt2_stand_ins() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], 'Ń');
        let inv = char_to_byte_map();
        assert_eq!(inv.len(), 256);
        for b in 0..=255u8 {
            assert_eq!(inv[&t[b as usize]], b);
        }
    }

    fn table(tokens: &[&str], merges: &[&str]) -> (MergeTable, HashMap<String, u32>) {
        let vocab: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let merges: Vec<String> = merges.iter().map(|m| m.to_string()).collect();
        (MergeTable::new(&vocab, &merges), vocab)
    }

    #[test]
    fn merges_apply_by_rank_then_leftmost() {
        let (m, v) = table(
            &["a", "b", "c", "ab", "bc", "aa", "abc"],
            &["b c", "a b", "a a", "a bc"],
        );
        let mut out = Vec::new();
        // "abc": "b c" has the lower rank, then "a bc".
        m.encode_word(b"abc", 99, &mut out);
        assert_eq!(out, vec![v["abc"]]);
        out.clear();
        // "aaa": leftmost pair merges first.
        m.encode_word(b"aaa", 99, &mut out);
        assert_eq!(out, vec![v["aa"], v["a"]]);
        out.clear();
        // A byte outside the vocabulary becomes the unknown id.
        m.encode_word(b"az", 99, &mut out);
        assert_eq!(out, vec![v["a"], 99]);
    }
}
