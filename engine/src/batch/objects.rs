//! The wire objects of the batch API, as OpenAI shapes them; they are
//! also what the store keeps (plus the owning tenant).

use serde::{Deserialize, Serialize};

/// A file (`object: "file"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileObject {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: u64,
    pub filename: String,
    /// `batch` (uploaded), `batch_output` (written by a batch).
    pub purpose: String,
    pub status: String,
    /// The tenant that owns it (not sent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

/// Where a batch is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    /// Still work for the runner (validate, run, finalize or cancel).
    pub fn active(self) -> bool {
        matches!(
            self,
            BatchStatus::Validating
                | BatchStatus::InProgress
                | BatchStatus::Finalizing
                | BatchStatus::Cancelling
        )
    }
}

/// `request_counts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

/// A batch (`object: "batch"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchObject {
    pub id: String,
    pub object: String,
    pub endpoint: String,
    /// Why the batch failed as a whole (`{object: "list", data: [..]}`).
    pub errors: Option<serde_json::Value>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: BatchStatus,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: u64,
    pub in_progress_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub finalizing_at: Option<u64>,
    pub completed_at: Option<u64>,
    pub failed_at: Option<u64>,
    pub expired_at: Option<u64>,
    pub cancelling_at: Option<u64>,
    pub cancelled_at: Option<u64>,
    pub request_counts: RequestCounts,
    pub metadata: Option<serde_json::Value>,
    /// The tenant that owns it (not sent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

impl BatchObject {
    /// The object as sent to clients (without the owner).
    pub fn wire(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("owner");
        }
        v
    }
}

impl FileObject {
    /// The object as sent to clients (without the owner).
    pub fn wire(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("owner");
        }
        v
    }
}
