//! Layered configuration for every process kind.
//!
//! Each process kind (`model`, `node`, `engine`, `router`, ...) has one typed
//! config struct with documented defaults (see docs/CONFIG.md). Values are
//! resolved in this order, later wins:
//!
//! 1. the struct's `Default`,
//! 2. the section named after the process kind in the TOML file given by
//!    `--config` (or `KVFABRIC_CONFIG`), e.g. `[node]`,
//! 3. `KVFABRIC_<KEY>` environment variables (key upper-cased, e.g.
//!    `KVFABRIC_CACHE_DIR`),
//! 4. command-line flags.
//!
//! Sizes are strings with units (`8GiB`, `512MiB`) parsed by `bytesize`.

use std::path::Path;

use anyhow::Context;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Environment variable prefix shared by every key.
pub const ENV_PREFIX: &str = "KVFABRIC_";

/// Resolve the config of process kind `section` from defaults, file, env and flags.
///
/// `flags` must serialize only the flags the user actually gave (use
/// `Option` fields with `skip_serializing_if = "Option::is_none"`), so an
/// absent flag does not hide a value from the file or the environment.
pub fn load<T, F>(section: &str, file: Option<&Path>, flags: &F) -> anyhow::Result<T>
where
    T: Serialize + DeserializeOwned + Default,
    F: Serialize,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        anyhow::ensure!(
            path.exists(),
            "config file {} does not exist",
            path.display()
        );
        figment = figment.merge(Figment::from(Toml::file(path)).focus(section));
    }
    // Only this kind's keys: `KVFABRIC_NODE_ID` must not break loading `[cluster]`.
    let keys: Vec<String> = Figment::from(Serialized::defaults(T::default()))
        .extract::<figment::value::Dict>()
        .map(|d| d.into_keys().collect())
        .unwrap_or_default();
    figment = figment
        .merge(Env::prefixed(ENV_PREFIX).filter(move |k| keys.iter().any(|x| k == x.as_str())))
        .merge(Serialized::defaults(flags));
    figment
        .extract()
        .with_context(|| format!("invalid [{section}] configuration"))
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Demo {
        name: String,
        size: bytesize::ByteSize,
        port: u16,
    }

    impl Default for Demo {
        fn default() -> Self {
            Demo {
                name: "default".into(),
                size: bytesize::ByteSize::mib(1),
                port: 1,
            }
        }
    }

    #[derive(Serialize, Default)]
    struct DemoFlags {
        #[serde(skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
    }

    #[test]
    fn file_then_env_then_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "kv.toml",
                "[demo]\nname = \"from-file\"\nsize = \"8GiB\"\nport = 2\n[other]\nport = 9\n",
            )?;
            let path = jail.directory().join("kv.toml");
            let got: Demo = load("demo", Some(&path), &DemoFlags::default()).unwrap();
            assert_eq!(got.name, "from-file");
            assert_eq!(got.size, bytesize::ByteSize::gib(8));
            assert_eq!(got.port, 2);

            jail.set_env("KVFABRIC_PORT", "3");
            jail.set_env("KVFABRIC_KEY_OF_ANOTHER_SECTION", "x");
            let got: Demo = load("demo", Some(&path), &DemoFlags::default()).unwrap();
            assert_eq!(got.port, 3, "env beats file");

            let flags = DemoFlags { port: Some(4) };
            let got: Demo = load("demo", Some(&path), &flags).unwrap();
            assert_eq!(got.port, 4, "flags beat env");
            assert_eq!(got.name, "from-file");
            Ok(())
        });
    }

    #[test]
    fn defaults_without_file_and_bad_values_are_errors() {
        figment::Jail::expect_with(|jail| {
            let got: Demo = load("demo", None, &DemoFlags::default()).unwrap();
            assert_eq!(got, Demo::default());
            jail.set_env("KVFABRIC_SIZE", "lots");
            let err = load::<Demo, _>("demo", None, &DemoFlags::default()).unwrap_err();
            assert!(
                format!("{err:#}").to_lowercase().contains("size"),
                "{err:#}"
            );
            Ok(())
        });
    }

    /// Every key of `T`'s defaults appears as `` `key` `` in section `[section]` of docs/CONFIG.md.
    pub(crate) fn assert_documented<T: Serialize + Default>(section: &str) {
        let doc = include_str!("../docs/CONFIG.md");
        let start = doc
            .find(&format!("## `[{section}]`"))
            .unwrap_or_else(|| panic!("docs/CONFIG.md has no `[{section}]` section"));
        let body = &doc[start + 4..];
        let body = &body[..body.find("\n## ").unwrap_or(body.len())];
        let value = figment::Figment::from(Serialized::defaults(T::default()))
            .extract::<figment::value::Dict>()
            .unwrap();
        for key in value.keys() {
            assert!(
                body.contains(&format!("| `{key}` |")),
                "docs/CONFIG.md section [{section}] does not document `{key}`"
            );
        }
    }

    #[test]
    fn config_md_lists_every_key() {
        assert_documented::<crate::model::ModelConfig>("model");
        assert_documented::<kvfabric_node::cluster::ClusterConfig>("cluster");
        assert_documented::<kvfabric_store::NodeConfig>("node");
        assert_documented::<kvfabric_engine::EngineConfig>("engine");
        assert_documented::<kvfabric_connector::ConnectorConfig>("connector");
        assert_documented::<kvfabric_router::RouterConfig>("router");
    }

    #[test]
    fn kvfabric_isa_reaches_the_engine_config_through_the_env_layer() {
        use kvfabric_engine::{EngineConfig, IsaChoice};
        figment::Jail::expect_with(|jail| {
            jail.create_file("kv.toml", "[engine]\nisa = \"avx2\"\n")?;
            let path = jail.directory().join("kv.toml");
            let flags = crate::engine::EngineFlags::default();
            let got: EngineConfig = load("engine", None, &flags).unwrap();
            assert_eq!(got.isa, IsaChoice::Auto);
            let got: EngineConfig = load("engine", Some(&path), &flags).unwrap();
            assert_eq!(got.isa, IsaChoice::Avx2, "from the file");
            jail.set_env("KVFABRIC_ISA", "scalar");
            let got: EngineConfig = load("engine", Some(&path), &flags).unwrap();
            assert_eq!(got.isa, IsaChoice::Scalar, "the env var beats the file");
            let flags = crate::engine::EngineFlags {
                isa: Some("avx512".into()),
                ..Default::default()
            };
            let got: EngineConfig = load("engine", Some(&path), &flags).unwrap();
            assert_eq!(got.isa, IsaChoice::Avx512, "--isa beats the env var");
            Ok(())
        });
    }

    #[test]
    fn the_node_api_key_comes_from_the_file_or_kvfabric_node_api_key() {
        use kvfabric_connector::{ApiKey, ConnectorConfig};
        figment::Jail::expect_with(|jail| {
            let flags = crate::engine::ConnectorFlags::default();
            let got: ConnectorConfig = load("connector", None, &flags).unwrap();
            assert_eq!(got.node_api_key, None, "default: none");
            jail.create_file("kv.toml", "[connector]\nnode_api_key = \"kvf-file\"\n")?;
            let path = jail.directory().join("kv.toml");
            let got: ConnectorConfig = load("connector", Some(&path), &flags).unwrap();
            assert_eq!(got.node_api_key, Some(ApiKey::new("kvf-file")));
            jail.set_env("KVFABRIC_NODE_API_KEY", "kvf-env");
            let got: ConnectorConfig = load("connector", Some(&path), &flags).unwrap();
            assert_eq!(got.node_api_key, Some(ApiKey::new("kvf-env")));
            assert!(!format!("{got:?}").contains("kvf-env"), "printed: {got:?}");
            Ok(())
        });
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = load::<Demo, _>(
            "demo",
            Some(Path::new("/nonexistent.toml")),
            &DemoFlags::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }
}
