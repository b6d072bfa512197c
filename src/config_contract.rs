//! What ships around the binary must agree with it: every environment variable the Helm chart
//! sets is one the binary reads and the README's configuration reference lists, the chart's
//! values schema closes every object (a typo is refused, not ignored), and every field of
//! every CRD says what it is (`kubectl explain`).

use std::path::Path;

use serde_json::Value;

fn chart_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/artemis-studio-operator")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README's `## <heading>` section (up to the next `## `).
pub(crate) fn readme_section(heading: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("README.md has a section \"## {heading}\""))
        .to_string()
}

/// The `- name: X` entries of every `env:` list in a template (template directives skipped).
fn env_names(template: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut names = vec![];
    let mut env_indent: Option<usize> = None;
    let mut item_indent: Option<usize> = None;
    for line in template.lines() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with("{{") || t.starts_with('#') {
            continue;
        }
        if let Some(ei) = env_indent {
            if indent(line) <= ei && !t.starts_with("- ") || indent(line) < ei {
                env_indent = None;
                item_indent = None;
            } else if let Some(rest) = t.strip_prefix("- ") {
                let ii = *item_indent.get_or_insert(indent(line));
                if indent(line) == ii {
                    let name = rest
                        .trim_start_matches('{')
                        .trim()
                        .strip_prefix("name:")
                        .map(|n| {
                            n.split(',')
                                .next()
                                .unwrap_or("")
                                .trim_end_matches('}')
                                .trim()
                                .to_string()
                        });
                    match name {
                        Some(n) if !n.is_empty() => names.push(n),
                        _ => panic!("an env entry that does not start with its name: {line}"),
                    }
                }
                continue;
            } else {
                continue;
            }
        }
        if t == "env:" {
            env_indent = Some(indent(line));
        }
    }
    names
}

#[test]
fn the_env_parser_reads_entries_and_nothing_else() {
    let t = "spec:\n  containers:\n    - name: operator\n      env:\n        - name: A\n          value: x\n        {{- if .Values.b }}\n        - name: B\n          valueFrom:\n            fieldRef: {fieldPath: metadata.name}\n        {{- end }}\n        - {name: C, value: y}\n      ports:\n        - name: http\n";
    assert_eq!(env_names(t), ["A", "B", "C"]);
}

#[test]
fn every_env_var_the_chart_sets_is_one_the_binary_reads() {
    let read = crate::cli::run_env_vars();
    let set = env_names(&chart_file("templates/deployment.yaml"));
    assert!(
        set.iter().any(|n| n == "WATCH_NAMESPACES") && set.iter().any(|n| n == "DATABASE_URL"),
        "the parser found too little in deployment.yaml: {set:?}"
    );
    let unread: Vec<&String> = set.iter().filter(|n| !read.contains(n)).collect();
    assert!(
        unread.is_empty(),
        "charts/artemis-studio-operator/templates/deployment.yaml sets {unread:?}, which the binary never reads (it reads {read:?}; see src/cli.rs)"
    );
}

#[test]
fn the_readme_configuration_reference_lists_every_env_var() {
    let section = readme_section("Configuration reference");
    let missing: Vec<String> = crate::cli::run_env_vars()
        .into_iter()
        .filter(|v| !section.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md \"Configuration reference\" does not list {missing:?}: add a row per flag"
    );
}

/// Every object in the values schema either lists its properties and refuses any other key, or
/// is a map whose values have a schema, or is one of Kubernetes' own types passed through
/// (described as such: the API server validates them).
#[test]
fn the_values_schema_refuses_unknown_keys_at_every_level() {
    fn walk(v: &Value, path: &str, open: &mut Vec<String>) {
        let Some(o) = v.as_object() else { return };
        let is_object = match o.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => false,
        };
        if is_object {
            let closed = match o.get("additionalProperties") {
                Some(Value::Bool(false)) => true,
                Some(Value::Object(_)) => !o.contains_key("properties"),
                _ => false,
            };
            let passthrough = o
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| d.contains("Kubernetes' own type"));
            if !closed && !passthrough {
                open.push(path.to_string());
            }
        }
        if let Some(Value::Object(props)) = o.get("properties") {
            for (k, p) in props {
                walk(p, &format!("{path}.{k}"), open);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(child) = o.get(key) {
                walk(child, &format!("{path}[]"), open);
            }
        }
    }
    let schema: Value =
        serde_json::from_str(&chart_file("values.schema.json")).expect("values.schema.json is JSON");
    let mut open = vec![];
    walk(&schema, "$", &mut open);
    assert!(
        open.is_empty(),
        "values.schema.json: these objects accept unknown keys: {open:?}"
    );
}

/// `kubectl explain` gives a sentence for every spec and status field: no property of a
/// generated CRD is without a description.
#[test]
fn every_crd_field_has_a_description() {
    fn walk(v: &Value, path: &str, missing: &mut Vec<String>) {
        let Some(o) = v.as_object() else { return };
        if let Some(Value::Object(props)) = o.get("properties") {
            for (k, p) in props {
                let here = format!("{path}.{k}");
                let described = p
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.trim().is_empty());
                if !described {
                    missing.push(here.clone());
                }
                walk(p, &here, missing);
            }
        }
        if let Some(items) = o.get("items") {
            walk(items, &format!("{path}[]"), missing);
        }
        if let Some(extra @ Value::Object(_)) = o.get("additionalProperties") {
            walk(extra, &format!("{path}{{}}"), missing);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(alts)) = o.get(key) {
                for alt in alts {
                    walk(alt, path, missing);
                }
            }
        }
    }
    let mut missing = vec![];
    for crd in crate::api::all_crds() {
        let kind = crd.spec.names.kind.clone();
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .map(|s| serde_json::to_value(s).expect("schema to JSON"))
                .unwrap_or(Value::Null);
            for top in ["spec", "status"] {
                let root = &schema["properties"][top];
                if root.is_null() {
                    continue;
                }
                if root
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(|d| d.trim().is_empty())
                {
                    missing.push(format!("{kind}.{top}"));
                }
                walk(root, &format!("{kind}.{top}"), &mut missing);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} CRD field(s) without a description (add a doc comment in src/api/, then `make crds`):\n  {}",
        missing.len(),
        missing.join("\n  ")
    );
}
