//! Typed access to the [`BatchStore`]: files (metadata and content),
//! batches, and each batch's per-request results.
//!
//! Keys: `f/<file id>` (metadata), `d/<file id>` (content), `b/<batch id>`,
//! `r/<batch id>/<line index, 8 digits>` (one request's result, so the
//! results of a batch scan in input order).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::objects::{BatchObject, FileObject};
use super::store::BatchStore;
use crate::EngineError;

/// One request's stored result: an output-file line or an error-file line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredResult {
    /// True: goes to the output file; false: to the error file.
    pub ok: bool,
    /// The line, `{id, custom_id, response, error}`.
    pub line: serde_json::Value,
}

/// The batch API's records in a [`BatchStore`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct Catalog {
    store: Arc<dyn BatchStore>,
}

fn decode<T: DeserializeOwned>(key: &[u8], v: &[u8]) -> Result<T, EngineError> {
    serde_json::from_slice(v).map_err(|source| EngineError::BatchRecord {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, EngineError> {
    serde_json::to_vec(v).map_err(|e| EngineError::BatchStore {
        op: "encode",
        source: e.into(),
    })
}

impl Catalog {
    pub fn new(store: Arc<dyn BatchStore>) -> Catalog {
        Catalog { store }
    }

    fn get<T: DeserializeOwned>(&self, key: String) -> Result<Option<T>, EngineError> {
        match self.store.get(key.as_bytes())? {
            Some(v) => decode(key.as_bytes(), &v).map(Some),
            None => Ok(None),
        }
    }

    fn scan<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(Vec<u8>, T)>, EngineError> {
        self.store
            .scan(prefix.as_bytes())?
            .into_iter()
            .map(|(k, v)| decode(&k, &v).map(|t| (k, t)))
            .collect()
    }

    /// Store a file's metadata and content.
    pub fn put_file(&self, file: &FileObject, content: &[u8]) -> Result<(), EngineError> {
        // Content first: metadata is what makes the file visible.
        self.store
            .put(format!("d/{}", file.id).as_bytes(), content)?;
        self.store
            .put(format!("f/{}", file.id).as_bytes(), &encode(file)?)
    }

    pub fn file(&self, id: &str) -> Result<Option<FileObject>, EngineError> {
        self.get(format!("f/{id}"))
    }

    pub fn file_content(&self, id: &str) -> Result<Option<Vec<u8>>, EngineError> {
        self.store.get(format!("d/{id}").as_bytes())
    }

    /// Every file, oldest first.
    pub fn files(&self) -> Result<Vec<FileObject>, EngineError> {
        let mut files: Vec<FileObject> = self.scan("f/")?.into_iter().map(|(_, f)| f).collect();
        files.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(files)
    }

    pub fn delete_file(&self, id: &str) -> Result<(), EngineError> {
        self.store.delete(format!("f/{id}").as_bytes())?;
        self.store.delete(format!("d/{id}").as_bytes())
    }

    pub fn put_batch(&self, batch: &BatchObject) -> Result<(), EngineError> {
        self.store
            .put(format!("b/{}", batch.id).as_bytes(), &encode(batch)?)
    }

    pub fn batch(&self, id: &str) -> Result<Option<BatchObject>, EngineError> {
        self.get(format!("b/{id}"))
    }

    /// Every batch, oldest first.
    pub fn batches(&self) -> Result<Vec<BatchObject>, EngineError> {
        let mut all: Vec<BatchObject> = self.scan("b/")?.into_iter().map(|(_, b)| b).collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    /// Store the result of line `index` of `batch`.
    pub fn put_result(
        &self,
        batch: &str,
        index: usize,
        result: &StoredResult,
    ) -> Result<(), EngineError> {
        self.store
            .put(format!("r/{batch}/{index:08}").as_bytes(), &encode(result)?)
    }

    /// The stored results of `batch`, by line index, in input order.
    pub fn results(&self, batch: &str) -> Result<Vec<(usize, StoredResult)>, EngineError> {
        let prefix = format!("r/{batch}/");
        self.scan(&prefix)?
            .into_iter()
            .map(|(k, r)| {
                let index = std::str::from_utf8(&k[prefix.len()..])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| EngineError::BatchResultKey {
                        key: String::from_utf8_lossy(&k).into_owned(),
                    })?;
                Ok((index, r))
            })
            .collect()
    }
}
