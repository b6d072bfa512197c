//! The plugin as released (no test bed): `kubectl artemis version` reports the package version
//! from the binary alone, and the krew manifest template (deploy/krew/artemis.yaml) agrees with
//! what deploy/release/archives packs: the binary's name, the archive names, the platforms.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn plugin(args: &[&str]) -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_kubectl-artemis"));
    // No database and no kubeconfig: `version` reads neither.
    let out = Command::new(bin)
        .args(args)
        .env_remove("DATABASE_URL")
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run kubectl-artemis");
    assert!(
        out.status.success(),
        "kubectl-artemis {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn version_prints_the_package_version_and_the_commit() {
    let json: serde_json::Value =
        serde_json::from_str(plugin(&["version", "--output", "json"]).trim()).expect("one JSON document");
    assert_eq!(json["kind"], "Version");
    assert_eq!(json["name"], "kubectl-artemis");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    let commit = json["commit"].as_str().expect("a commit");
    // The release script sets ARTEMIS_STUDIO_COMMIT; a plain build says it does not know.
    match option_env!("ARTEMIS_STUDIO_COMMIT") {
        Some(c) if !c.is_empty() => assert_eq!(commit, c),
        _ => assert_eq!(commit, "unknown"),
    }

    let line = plugin(&["version"]);
    assert_eq!(
        line.trim(),
        format!("kubectl-artemis {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );
    let yaml: Value = serde_saphyr::from_str(&plugin(&["version", "-o", "yaml"])).expect("YAML");
    assert_eq!(yaml["version"].as_str(), Some(env!("CARGO_PKG_VERSION")));
}

/// The script's Rust target → krew (os, arch) table: its `platform()` case arms.
fn script_platforms(script: &str) -> Vec<(String, String, String)> {
    script
        .lines()
        .filter_map(|l| {
            let (target, rest) = l.trim().split_once(") echo \"")?;
            let (os, arch) = rest.strip_suffix("\" ;;")?.split_once(' ')?;
            Some((target.to_string(), os.to_string(), arch.to_string()))
        })
        .collect()
}

#[test]
fn the_krew_manifest_template_names_what_the_release_script_packs() {
    let script = std::fs::read_to_string(repo().join("deploy/release/archives")).expect("the release script");
    let text = std::fs::read_to_string(repo().join("deploy/krew/artemis.yaml")).expect("the krew manifest");
    let m: Value = serde_saphyr::from_str(&text).expect("the manifest template is YAML");

    assert_eq!(
        m["apiVersion"].as_str(),
        Some("krew.googlecontainertools.github.com/v1alpha2")
    );
    assert_eq!(m["kind"].as_str(), Some("Plugin"));
    // krew: the plugin's name is the manifest's file name, and `kubectl <name>` runs it.
    assert_eq!(m["metadata"]["name"].as_str(), Some("artemis"));
    let spec = &m["spec"];
    assert_eq!(
        spec["version"].as_str(),
        Some("v@VERSION@"),
        "the script fills in the version"
    );
    assert!(spec["shortDescription"].as_str().is_some_and(|s| !s.is_empty()));

    // One platform block, between the markers the script repeats it by.
    let platforms = spec["platforms"].as_array().expect("spec.platforms");
    assert_eq!(platforms.len(), 1, "the template's one platform block");
    assert_eq!(text.matches("# @platform\n").count(), 1);
    assert_eq!(text.matches("# @end\n").count(), 1);
    let p = &platforms[0];
    assert_eq!(p["selector"]["matchLabels"]["os"].as_str(), Some("@OS@"));
    assert_eq!(p["selector"]["matchLabels"]["arch"].as_str(), Some("@ARCH@"));
    assert_eq!(p["sha256"].as_str(), Some("@SHA256@"));
    assert_eq!(p["bin"].as_str(), Some("kubectl-artemis"));
    let uri = p["uri"].as_str().expect("uri");
    assert_eq!(uri, "@BASE_URL@/kubectl-artemis-@VERSION@-@OS@-@ARCH@.tar.gz");
    assert!(
        script.contains("name=kubectl-artemis-$version-$os-$arch.tar.gz"),
        "the script names its archives as the manifest's uri does"
    );
    let from: Vec<&str> = p["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["from"].as_str())
        .collect();
    assert_eq!(from, ["kubectl-artemis", "@DOC_FILE@"]);
    assert!(
        script.contains(r#"cp "$bin" "$stage/$t/kubectl-artemis""#),
        "the script packs the binary as kubectl-artemis"
    );

    // Every target the script packs maps to a krew platform, and the host's (the one release
    // machine this repository builds on) is linux/amd64.
    let table = script_platforms(&script);
    assert!(
        table.contains(&("x86_64-unknown-linux-gnu".into(), "linux".into(), "amd64".into())),
        "{table:?}"
    );
    for (target, os, arch) in &table {
        assert!(matches!(os.as_str(), "linux" | "darwin"), "{target}: os {os}");
        assert!(
            matches!(arch.as_str(), "amd64" | "arm64"),
            "{target}: arch {arch}"
        );
    }
}
