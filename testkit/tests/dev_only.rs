//! The kit stays dev-only and the libraries ship no test code: no workspace
//! manifest names `kvfabric-testkit` outside `[dev-dependencies]`, and the
//! store, whose etcd test process once made `tempfile` a normal dependency,
//! takes `tempfile` only for its tests.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the kit sits in the workspace")
        .to_path_buf()
}

fn manifest(dir: &Path) -> toml::Table {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    text.parse().expect("Cargo.toml parses")
}

fn members() -> Vec<(String, toml::Table)> {
    let root = workspace_root();
    let top = manifest(&root);
    let names = top["workspace"]["members"].as_array().expect("members");
    let mut out = vec![(".".to_string(), top.clone())];
    for m in names {
        let m = m.as_str().expect("member path");
        out.push((m.to_string(), manifest(&root.join(m))));
    }
    out
}

/// The names in `table[section]` (and under any `[target.*.section]`).
fn deps(table: &toml::Table, section: &str) -> Vec<String> {
    let mut names: Vec<String> = table
        .get(section)
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(targets) = table.get("target").and_then(|t| t.as_table()) {
        for t in targets.values() {
            if let Some(d) = t.get(section).and_then(|d| d.as_table()) {
                names.extend(d.keys().cloned());
            }
        }
    }
    names
}

#[test]
fn the_kit_is_only_ever_a_dev_dependency() {
    let all = members();
    assert!(all.len() > 10, "read {} manifests", all.len());
    for (path, m) in &all {
        for section in ["dependencies", "build-dependencies"] {
            assert!(
                !deps(m, section).iter().any(|d| d == "kvfabric-testkit"),
                "{path}/Cargo.toml names kvfabric-testkit in [{section}]"
            );
        }
    }
    let users = all
        .iter()
        .filter(|(_, m)| {
            deps(m, "dev-dependencies")
                .iter()
                .any(|d| d == "kvfabric-testkit")
        })
        .count();
    assert!(users >= 4, "only {users} crates use the kit");
}

#[test]
fn the_store_takes_tempfile_only_for_its_tests() {
    let store = manifest(&workspace_root().join("store"));
    assert!(
        !deps(&store, "dependencies").iter().any(|d| d == "tempfile"),
        "tempfile is a normal dependency of kvfabric-store"
    );
    assert!(deps(&store, "dev-dependencies")
        .iter()
        .any(|d| d == "tempfile"));
}
