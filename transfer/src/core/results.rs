//! Assembling a batch's per-op results from the parts that produced them: the
//! ops refused before anything moved, each transport's share, and the ops a
//! transport handed back to run elsewhere.

use crate::error::BadInput;
use crate::TransferError;

/// The outcome of one op.
pub(crate) type OpResult = Result<(), TransferError>;

/// One slot per op of a batch, in submission order; a slot left empty when
/// the batch ends means the op never ran, which is reported as an error.
#[derive(Debug)]
pub(crate) struct BatchResults(Vec<Option<OpResult>>);

impl BatchResults {
    /// `n` empty slots.
    pub fn new(n: usize) -> Self {
        BatchResults(vec![None; n])
    }

    /// Slots as a transport left them (`None`: it did not carry that op).
    pub fn from_slots(slots: Vec<Option<OpResult>>) -> Self {
        BatchResults(slots)
    }

    /// Settle op `i`.
    pub fn set(&mut self, i: usize, r: OpResult) {
        self.0[i] = Some(r);
    }

    /// Settle the ops at `index` (positions in this batch) with the results
    /// of the sub-batch made of them, in the same order.
    pub fn merge(&mut self, index: impl IntoIterator<Item = usize>, outcome: Vec<OpResult>) {
        for (i, r) in index.into_iter().zip(outcome) {
            self.0[i] = Some(r);
        }
    }

    /// Positions of the ops not settled yet.
    pub fn unsettled(&self) -> Vec<usize> {
        (0..self.0.len()).filter(|&i| self.0[i].is_none()).collect()
    }

    /// One result per op; an op nobody settled did not run.
    pub fn finish(self) -> Vec<OpResult> {
        self.0
            .into_iter()
            .map(|r| r.unwrap_or(Err(TransferError::InvalidArgument(BadInput::OpNotRun))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_parts_land_in_place_and_gaps_did_not_run() {
        let mut r = BatchResults::new(4);
        r.set(
            1,
            Err(TransferError::InvalidArgument(BadInput::ZeroLengthOp)),
        );
        assert_eq!(r.unsettled(), vec![0, 2, 3]);
        r.merge(
            [0, 3],
            vec![Ok(()), Err(TransferError::io_other("test", "x"))],
        );
        assert_eq!(r.unsettled(), vec![2]);
        let out = r.finish();
        assert_eq!(out[0], Ok(()));
        assert!(matches!(out[1], Err(TransferError::InvalidArgument(_))));
        assert_eq!(
            out[2],
            Err(TransferError::InvalidArgument(BadInput::OpNotRun))
        );
        assert_eq!(out[3], Err(TransferError::io_other("test", "x")));
    }
}
