//! [`BatchService`]: creates and cancels batches and runs them in the
//! background, one batch at a time, its requests through the same
//! handlers as interactive requests (a [`BatchExecutor`]: the HTTP layer's
//! state, `http/batch.rs`'s `execute`) on a batch-class engine handle, so
//! they run below interactive requests.
//!
//! A batch goes validating -> in_progress -> finalizing -> completed
//! (or cancelling -> cancelled, or expired past its completion window, or
//! failed when its input file is gone). A cancel or the window's end also
//! stops the requests already running (`stop.rs`); an expired batch keeps
//! its finished results and lists every line without one in its error file
//! (`batch_expired`), as OpenAI's does.
//! Each request's result is stored the moment it ends; a process that
//! stops mid-batch finds the batch in_progress at its next start and runs
//! only the lines without a stored result. Finalizing writes the output
//! file (lines that got a 200) and the error file (the others), under ids
//! derived from the batch id, so finalizing twice writes the same files.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use kvfabric_tenants::Identity;
use tokio::sync::Notify;

use super::catalog::{Catalog, StoredResult};
use super::config::BatchConfig;
use super::executor::BatchExecutor;
use super::lines::{self, InputLine};
use super::objects::{BatchObject, BatchStatus, FileObject, RequestCounts};
use super::stop::{Stop, Stops};
use crate::clock::unix_now;
use crate::EngineError;

/// The batch API's state; shared by the HTTP handlers and the runner task.
#[derive(Debug)]
pub struct BatchService {
    pub(crate) catalog: Catalog,
    pub(crate) cfg: BatchConfig,
    wake: Notify,
    /// Serializes read-modify-write of batch objects (runner vs cancel).
    update: Mutex<()>,
    stops: Stops,
    /// Who created each batch this process knows of (runs under their tenant).
    owners: Mutex<HashMap<String, Identity>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BatchService {
    /// Start the runner on the current tokio runtime: it runs batches
    /// through `exec` (the HTTP layer's state, whose engine handle should be
    /// [`batch_class`](crate::EngineHandle::batch_class)). Batches left
    /// active by an earlier process resume at once.
    pub fn start(
        catalog: Catalog,
        cfg: BatchConfig,
        exec: impl BatchExecutor,
    ) -> (Arc<BatchService>, tokio::task::JoinHandle<()>) {
        let service = Arc::new(BatchService {
            catalog,
            cfg,
            wake: Notify::new(),
            update: Mutex::new(()),
            stops: Stops::default(),
            owners: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(service.clone().run(exec));
        (service, task)
    }

    /// Create a batch over `input` (already checked) and wake the runner.
    pub fn create(
        &self,
        id: String,
        input: &FileObject,
        endpoint: &str,
        metadata: Option<serde_json::Value>,
        who: &Identity,
    ) -> Result<BatchObject, EngineError> {
        let now = unix_now();
        let batch = BatchObject {
            id: id.clone(),
            object: "batch".into(),
            endpoint: endpoint.into(),
            errors: None,
            input_file_id: input.id.clone(),
            completion_window: "24h".into(),
            status: BatchStatus::Validating,
            output_file_id: None,
            error_file_id: None,
            created_at: now,
            in_progress_at: None,
            expires_at: Some(now + self.cfg.completion_window_secs),
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            request_counts: RequestCounts::default(),
            metadata,
            owner: who.label().to_owned(),
        };
        lock(&self.owners).insert(id, who.clone());
        self.catalog.put_batch(&batch)?;
        self.wake.notify_one();
        Ok(batch)
    }

    /// Ask `id` to stop: no more of its requests start, the running ones
    /// are dropped; it ends cancelled with the results it has. Returns the
    /// batch as it is now.
    pub fn cancel(&self, id: &str) -> Result<Option<BatchObject>, EngineError> {
        let b = self.update_batch(id, |b| {
            if b.status.active() && b.status != BatchStatus::Finalizing {
                b.status = BatchStatus::Cancelling;
                b.cancelling_at = Some(unix_now());
            }
        })?;
        if b.as_ref()
            .is_some_and(|b| b.status == BatchStatus::Cancelling)
        {
            self.stops.cancel(id);
            self.wake.notify_one();
        }
        Ok(b)
    }

    /// Apply `f` to the stored batch `id` and store it (None: no such batch).
    fn update_batch(
        &self,
        id: &str,
        f: impl FnOnce(&mut BatchObject),
    ) -> Result<Option<BatchObject>, EngineError> {
        let _g = lock(&self.update);
        let Some(mut b) = self.catalog.batch(id)? else {
            return Ok(None);
        };
        f(&mut b);
        self.catalog.put_batch(&b)?;
        Ok(Some(b))
    }

    /// The runner: the oldest active batch, else sleep until woken.
    async fn run(self: Arc<Self>, exec: impl BatchExecutor) {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let next = self
                .catalog
                .batches()
                .map(|all| all.into_iter().find(|b| b.status.active()));
            match next {
                Ok(Some(b)) => {
                    if let Err(e) = self.step(&exec, b).await {
                        tracing::error!(error = %e, "batch runner");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                Ok(None) => woken.await,
                Err(e) => {
                    tracing::error!(error = %e, "batch runner: listing batches");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Move batch `b` one stage on.
    async fn step(&self, exec: &impl BatchExecutor, b: BatchObject) -> Result<(), EngineError> {
        let input = self.catalog.file_content(&b.input_file_id)?;
        let Some(input) = input.filter(|_| b.status != BatchStatus::Failed) else {
            return self.fail(&b.id, "input_file_missing", "the input file was deleted");
        };
        let lines = lines::parse(&input, &b.endpoint);
        match b.status {
            BatchStatus::Validating => {
                let total = lines.len() as u64;
                self.update_batch(&b.id, |b| {
                    if b.status == BatchStatus::Validating {
                        b.status = BatchStatus::InProgress;
                        b.in_progress_at = Some(unix_now());
                        b.request_counts.total = total;
                    }
                })?;
                Ok(())
            }
            BatchStatus::InProgress => {
                let Some(who) = self.owner(exec, &b) else {
                    return self.fail(
                        &b.id,
                        "owner_unknown",
                        "the batch's tenant is not known after a restart (multi-tenant mode)",
                    );
                };
                match self.run_lines(exec, &who, &b, lines).await? {
                    Some(Stop::Cancelled) => return self.finalize(&b.id, BatchStatus::Cancelled),
                    Some(Stop::Expired) => return self.finalize(&b.id, BatchStatus::Expired),
                    None => {}
                }
                self.update_batch(&b.id, |b| {
                    b.status = BatchStatus::Finalizing;
                    b.finalizing_at = Some(unix_now());
                })?;
                Ok(())
            }
            BatchStatus::Finalizing => self.finalize(&b.id, BatchStatus::Completed),
            _ => self.finalize(&b.id, BatchStatus::Cancelled),
        }
    }

    /// The creator's identity: known in this process, or (after a restart)
    /// the tenant of the stored owner's name.
    fn owner(&self, exec: &impl BatchExecutor, b: &BatchObject) -> Option<Identity> {
        if let Some(who) = lock(&self.owners).get(&b.id) {
            return Some(who.clone());
        }
        exec.identity_of(&b.owner)
    }

    fn fail(&self, id: &str, code: &str, message: &str) -> Result<(), EngineError> {
        let errors = serde_json::json!({
            "object": "list",
            "data": [{"code": code, "message": message, "param": null, "line": null}],
        });
        self.update_batch(id, |b| {
            b.status = BatchStatus::Failed;
            b.failed_at = Some(unix_now());
            b.errors = Some(errors);
        })?;
        Ok(())
    }

    /// Run every line of `b` without a stored result, storing each result
    /// as it ends, until done (None) or the batch must stop (cancelled or
    /// expired: the lines still running are dropped).
    async fn run_lines(
        &self,
        exec: &impl BatchExecutor,
        who: &Identity,
        b: &BatchObject,
        lines: Vec<InputLine>,
    ) -> Result<Option<Stop>, EngineError> {
        let done: HashSet<usize> = self
            .catalog
            .results(&b.id)?
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        let todo = lines
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !done.contains(i));
        let in_flight = self.cfg.max_seqs.max(1) * 2;
        let mut results = futures::stream::iter(todo)
            .map(|(i, line)| async move { (i, self.run_line(exec, who, b, i, line).await) })
            .buffer_unordered(in_flight);
        let stop = self.stops.wait(b);
        tokio::pin!(stop);
        loop {
            let (i, result) = tokio::select! {
                biased;
                why = &mut stop => return Ok(Some(why)),
                r = results.next() => match r {
                    Some(r) => r,
                    None => return Ok(None),
                },
            };
            self.catalog.put_result(&b.id, i, &result)?;
            self.update_batch(&b.id, |b| {
                if result.ok {
                    b.request_counts.completed += 1;
                } else {
                    b.request_counts.failed += 1;
                }
            })?;
        }
    }

    async fn run_line(
        &self,
        exec: &impl BatchExecutor,
        who: &Identity,
        b: &BatchObject,
        index: usize,
        line: InputLine,
    ) -> StoredResult {
        let id = format!("batch_req_{}_{index}", b.id);
        let custom_id = line.custom_id.as_deref();
        let body = match line.body {
            Ok(body) => body,
            Err((code, message)) => {
                return StoredResult {
                    ok: false,
                    line: lines::error_line(&id, custom_id, code, &message),
                }
            }
        };
        let (status, body) = exec.execute(who.clone(), &b.endpoint, body).await;
        let request_id = body
            .get("id")
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| id.clone(), str::to_owned);
        StoredResult {
            ok: status == 200,
            line: lines::response_line(&id, custom_id, status, &request_id, body),
        }
    }

    /// Write the output and error files and end the batch as `status`
    /// (expired: every line without a result is a `batch_expired` error).
    fn finalize(&self, id: &str, status: BatchStatus) -> Result<(), EngineError> {
        let Some(b) = self.catalog.batch(id)? else {
            return Ok(());
        };
        let mut results = self.catalog.results(id)?;
        if status == BatchStatus::Expired {
            results = self.with_expired_lines(&b, results)?;
        }
        let mut counts = RequestCounts {
            total: b.request_counts.total,
            ..RequestCounts::default()
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for (_, r) in &results {
            let (file, n) = if r.ok {
                (&mut out, &mut counts.completed)
            } else {
                (&mut err, &mut counts.failed)
            };
            *n += 1;
            file.extend_from_slice(r.line.to_string().as_bytes());
            file.push(b'\n');
        }
        let output_file_id = self.write_file(&b, "output", &out)?;
        let error_file_id = self.write_file(&b, "errors", &err)?;
        self.update_batch(id, |b| {
            let now = Some(unix_now());
            b.status = status;
            b.request_counts = counts;
            b.output_file_id = output_file_id;
            b.error_file_id = error_file_id;
            match status {
                BatchStatus::Cancelled => b.cancelled_at = now,
                BatchStatus::Expired => b.expired_at = now,
                _ => b.completed_at = now,
            }
        })?;
        self.stops.forget(id);
        lock(&self.owners).remove(id);
        tracing::info!(
            batch = id,
            ?status,
            completed = counts.completed,
            failed = counts.failed,
            "batch ended"
        );
        Ok(())
    }

    /// `results` plus a `batch_expired` error for every line of `b` without one.
    fn with_expired_lines(
        &self,
        b: &BatchObject,
        mut results: Vec<(usize, StoredResult)>,
    ) -> Result<Vec<(usize, StoredResult)>, EngineError> {
        let input = self.catalog.file_content(&b.input_file_id)?;
        let lines = input.map_or_else(Vec::new, |c| lines::parse(&c, &b.endpoint));
        let done: HashSet<usize> = results.iter().map(|(i, _)| *i).collect();
        for (i, line) in lines.iter().enumerate().filter(|(i, _)| !done.contains(i)) {
            let id = format!("batch_req_{}_{i}", b.id);
            let message = "the batch expired before this request finished";
            let line = lines::error_line(&id, line.custom_id.as_deref(), "batch_expired", message);
            results.push((i, StoredResult { ok: false, line }));
        }
        results.sort_by_key(|(i, _)| *i);
        Ok(results)
    }

    /// Store a result file of `b` (None when `content` is empty).
    fn write_file(
        &self,
        b: &BatchObject,
        kind: &str,
        content: &[u8],
    ) -> Result<Option<String>, EngineError> {
        if content.is_empty() {
            return Ok(None);
        }
        let id = format!("file-{}-{kind}", b.id);
        let file = FileObject {
            id: id.clone(),
            object: "file".into(),
            bytes: content.len() as u64,
            created_at: unix_now(),
            filename: format!("{}_{kind}.jsonl", b.id),
            purpose: "batch_output".into(),
            status: "processed".into(),
            owner: b.owner.clone(),
        };
        self.catalog.put_file(&file, content)?;
        Ok(Some(id))
    }
}
