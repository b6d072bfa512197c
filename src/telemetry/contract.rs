//! What the chart ships around `/metrics` must name what the binary exports: every metric a
//! query of the Grafana dashboard (`dashboards/artemis-studio.json`) or an alert
//! (`rules/artemis-studio.rules.yaml`) names is one this registry encodes, and every label
//! such a query matches on, groups by or joins on is one that metric carries (or one the scrape
//! adds). The alerts' `for` and thresholds in `values.yaml` are the rules file's (what promtool
//! checks is what the chart renders by default), and each alert's runbook is a row of the
//! README's troubleshooting table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use super::Metrics;

const PREFIX: &str = "artemis_studio_";

/// Labels the scrape puts on every series (Prometheus, and a Prometheus Operator
/// ServiceMonitor): queries may use them on any metric.
const TARGET_LABELS: &[&str] = &[
    "job",
    "instance",
    "namespace",
    "pod",
    "service",
    "container",
    "endpoint",
];

const RUNBOOK_ANCHOR: &str = "README.md#troubleshooting-by-condition-reason: ";

fn chart_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/artemis-studio-operator")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Exported series names (counters with `_total`, histograms as `_bucket`, `_sum`, `_count`)
/// and the labels each carries; `None` when the family encoded no sample (labels unknown).
type Exported = BTreeMap<String, Option<BTreeSet<String>>>;

/// One sample in every family (labels that no other test uses): prometheus-client encodes no
/// line at all, not even `# TYPE`, for a family without a sample, so a family missing here is
/// a metric this test does not know (add a sample for a new family).
fn metrics_with_a_sample_everywhere() -> Metrics {
    use super::{
        CapturePassLabels, ClusterLabels, CommandLabels, KindLabels, OutcomeLabels,
        capture::SubscriptionLabels, jolokia::NodeLabels, kube_api::ApiRequestLabels,
    };
    let m = Metrics::default();
    m.reconciled("ContractTest", "contract/test", "ok", 0.1);
    m.commands
        .get_or_create(&CommandLabels {
            command: "contract".into(),
            verdict: "succeeded".into(),
            cluster: "contract/test".into(),
        })
        .inc();
    m.node_outcomes
        .get_or_create(&OutcomeLabels {
            outcome: "Contract".into(),
        })
        .inc();
    m.planned
        .get_or_create(&KindLabels {
            kind: "ContractTest".into(),
        })
        .inc();
    let cluster = ClusterLabels {
        cluster: "contract/test".into(),
    };
    m.poll_seconds.get_or_create(&cluster).observe(0.1);
    m.inventory_objects.get_or_create(&cluster).set(1);
    m.capture_passes
        .get_or_create(&CapturePassLabels { result: "ok".into() })
        .inc();
    m.kube_api
        .requests
        .get_or_create(&ApiRequestLabels {
            verb: "get".into(),
            kind: "contract".into(),
            code: "2xx".into(),
        })
        .inc();
    // The Jolokia and capture families (a node and a subscription of this test's own).
    let node = "http://contract.test:8161/console/jolokia";
    let j = &m.jolokia;
    j.record_request(node, "read".into(), None);
    j.record_post(node, 0.01);
    let n = NodeLabels { node: node.into() };
    j.permitted_concurrency.get_or_create(&n).set(4);
    j.in_flight.get_or_create(&n).set(0);
    j.backoffs.get_or_create(&n).inc();
    j.record_inventory_read(node, true);
    let c = &m.capture;
    let sub = SubscriptionLabels {
        cluster: "contract/test".into(),
        subscription: "contract".into(),
    };
    c.stored.get_or_create(&sub).inc();
    c.dropped("contract/test", "contract", "rate_cap", 1);
    c.batch_size.get_or_create(&sub).observe(1.0);
    c.insert_seconds.get_or_create(&sub).observe(0.01);
    c.drain_lag_seconds.get_or_create(&sub).set(0.5);
    c.sampled.get_or_create(&sub).inc();
    c.drain_restarts.get_or_create(&sub).inc();
    m.census.count_from(std::sync::Arc::new(OneOfEach));
    m
}

/// A census with one sample in each of its families.
struct OneOfEach;
impl super::census::CensusSource for OneOfEach {
    fn count(&self) -> super::census::Counts {
        use super::census::{ConditionLabels, Counts, EndpointLabels, NodeLabels, ObjectLabels, TapLabels};
        let (kind, cluster) = ("ContractTest".to_string(), "contract/test".to_string());
        let mut c = Counts::default();
        let object = ObjectLabels {
            kind: kind.clone(),
            cluster: cluster.clone(),
            ready: "False".into(),
            reason: "Contract".into(),
        };
        c.objects.insert(object, 1);
        let flagged = ConditionLabels {
            kind,
            cluster: cluster.clone(),
            condition: "Stalled".into(),
            reason: "Contract".into(),
        };
        c.flagged.insert(flagged, 1);
        let node = NodeLabels {
            cluster: cluster.clone(),
            state: "live".into(),
        };
        c.nodes.insert(node, 1);
        let endpoint = EndpointLabels {
            cluster: cluster.clone(),
            node: "http://contract.test:8161/console/jolokia".into(),
            role: "active".into(),
        };
        c.endpoints.insert(endpoint, 1);
        let tap = TapLabels {
            cluster,
            subscription: "contract/contract".into(),
            state: "healthy".into(),
        };
        c.taps.insert(tap, 1);
        c
    }
}

/// The series names and labels of a Prometheus/OpenMetrics text encoding.
fn exported_from(text: &str) -> Exported {
    let mut out = Exported::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            let names: Vec<String> = match kind {
                "counter" => vec![format!("{name}_total"), format!("{name}_created")],
                "histogram" => ["_bucket", "_sum", "_count", "_created"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                "summary" => ["", "_sum", "_count", "_created"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                "info" => vec![format!("{name}_info")],
                _ => vec![name.to_string()],
            };
            for n in names {
                out.entry(n).or_insert(None);
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..end];
        let labels = if line[end..].starts_with('{') {
            label_names_of_sample(&line[end + 1..])
        } else {
            BTreeSet::new()
        };
        out.entry(name.to_string())
            .or_insert(None)
            .get_or_insert_with(BTreeSet::new)
            .extend(labels);
    }
    // `_created` is OpenMetrics' own, not a series a query should rely on.
    out.retain(|name, labels| !name.ends_with("_created") || labels.is_some());
    out
}

/// `a="x",b="y\"z"} 1` → {a, b}.
fn label_names_of_sample(s: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = s.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let name = name.trim_start_matches(',').trim();
        if name.is_empty() || name.starts_with('}') {
            break;
        }
        names.insert(name.to_string());
        // The quoted value.
        if chars.next() != Some('"') {
            break;
        }
        let mut escaped = false;
        for c in chars.by_ref() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => break,
                _ => escaped = false,
            }
        }
        if chars.peek() == Some(&'}') {
            break;
        }
    }
    names
}

fn exported() -> Exported {
    let text = metrics_with_a_sample_everywhere().encode_text();
    let exported = exported_from(&text);
    assert!(
        exported.contains_key("artemis_studio_leader")
            && exported.contains_key("artemis_studio_reconciles_total")
            && exported.contains_key("artemis_studio_jolokia_post_duration_seconds_bucket"),
        "the encoding parser found too little in\n{text}"
    );
    exported
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str,
    Num,
    Var,
    Punct(char),
}

/// PromQL (with Grafana's `$variables` and `label_values(…)`) as tokens: enough to find metric
/// names, matchers and label lists, nothing more.
fn tokens(expr: &str) -> Vec<Tok> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = vec![];
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if matches!(c, '"' | '\'' | '`') {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(Tok::Str);
        } else if c == '$' {
            i += 1;
            while i < chars.len() && (ident(chars[i]) || matches!(chars[i], '{' | '}')) {
                i += 1;
            }
            out.push(Tok::Var);
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push(Tok::Num);
        } else if ident(c) {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

/// Index of the token closing the bracket opened at `open`.
fn closing(toks: &[Tok], open: usize, o: char, c: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        if *t == Tok::Punct(o) {
            depth += 1;
        } else if *t == Tok::Punct(c) {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// Index of the token opening the bracket closed at `close`.
fn opening(toks: &[Tok], close: usize, o: char, c: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in toks[..=close].iter().enumerate().rev() {
        if *t == Tok::Punct(c) {
            depth += 1;
        } else if *t == Tok::Punct(o) {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

fn metrics_in(toks: &[Tok]) -> Vec<String> {
    toks.iter()
        .filter_map(|t| match t {
            Tok::Ident(s) if s.starts_with(PREFIX) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// The identifiers of a `(a, b)` list starting at `open`, and the index of its `)`.
fn ident_list(toks: &[Tok], open: usize) -> Option<(Vec<String>, usize)> {
    let close = closing(toks, open, '(', ')')?;
    let names = toks[open + 1..close]
        .iter()
        .filter_map(|t| match t {
            Tok::Ident(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    Some((names, close))
}

/// Every problem of one expression: a metric the binary does not export, or a label a metric
/// that is exported does not carry.
fn check_expr(at: &str, expr: &str, exported: &Exported) -> Vec<String> {
    let toks = tokens(expr);
    let mut problems = vec![];
    let all_metrics = metrics_in(&toks);
    for m in &all_metrics {
        if !exported.contains_key(m) {
            problems.push(format!("{at}: {m} is not a metric the binary exports"));
        }
    }
    // (label, the metrics that must carry it, where it is used)
    let mut needs: Vec<(String, Vec<String>, &str)> = vec![];
    for (i, t) in toks.iter().enumerate() {
        let Tok::Ident(word) = t else { continue };
        let next_is = |c: char| toks.get(i + 1) == Some(&Tok::Punct(c));
        if word.starts_with(PREFIX) && next_is('{') {
            let Some(close) = closing(&toks, i + 1, '{', '}') else {
                problems.push(format!("{at}: unclosed matcher after {word}"));
                continue;
            };
            for (prev, tok) in toks[i + 1..close].iter().zip(&toks[i + 2..close]) {
                if let Tok::Ident(label) = tok
                    && matches!(prev, Tok::Punct('{' | ','))
                {
                    needs.push((label.clone(), vec![word.clone()], "matcher"));
                }
            }
        } else if matches!(word.as_str(), "by" | "without") && next_is('(') {
            let Some((labels, close)) = ident_list(&toks, i + 1) else {
                problems.push(format!("{at}: unclosed label list after {word}"));
                continue;
            };
            // `sum by (…) (expr)`, or `sum (expr) by (…)`.
            let argument = if toks.get(close + 1) == Some(&Tok::Punct('(')) {
                closing(&toks, close + 1, '(', ')').map(|end| &toks[close + 1..=end])
            } else if i > 0 && toks[i - 1] == Tok::Punct(')') {
                opening(&toks, i - 1, '(', ')').map(|start| &toks[start..i])
            } else {
                None
            };
            let Some(argument) = argument else {
                problems.push(format!("{at}: `{word} (…)` without an argument"));
                continue;
            };
            let inner = metrics_in(argument);
            for l in labels {
                needs.push((l, inner.clone(), word.as_str()));
            }
        } else if matches!(word.as_str(), "on" | "ignoring" | "group_left" | "group_right") && next_is('(') {
            if let Some((labels, _)) = ident_list(&toks, i + 1) {
                for l in labels {
                    needs.push((l, all_metrics.clone(), word.as_str()));
                }
            }
        } else if word == "label_values" && next_is('(') {
            // label_values(selector, label) or label_values(label).
            let Some(close) = closing(&toks, i + 1, '(', ')') else {
                problems.push(format!("{at}: unclosed label_values("));
                continue;
            };
            if let Some(Tok::Ident(label)) = toks.get(close - 1) {
                needs.push((label.clone(), metrics_in(&toks[i + 1..close]), "label_values"));
            }
        }
    }
    for (label, on, why) in needs {
        if label == "__name__" || TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        for m in on {
            if let Some(Some(labels)) = exported.get(&m)
                && !labels.contains(&label)
            {
                problems.push(format!(
                    "{at}: {m} has no label {label:?} ({why}; it has {labels:?})"
                ));
            }
        }
    }
    problems
}

/// (where, expression) of every query of the dashboard: panel targets (rows' nested panels
/// too) and template variables.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            let id = &p["id"];
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    let r = t["refId"].as_str().unwrap_or("?");
                    out.push((format!("panel {title:?} (id {id}) target {r}"), expr.to_string()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = vec![];
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or("?");
        let query = match &v["query"] {
            Value::String(s) => Some(s.as_str()),
            q => q["query"].as_str(),
        };
        for q in [query, v["definition"].as_str()].into_iter().flatten() {
            out.push((format!("template variable ${name}"), q.to_string()));
        }
    }
    out
}

fn dashboard() -> Value {
    serde_json::from_str(&chart_file("dashboards/artemis-studio.json"))
        .expect("dashboards/artemis-studio.json is JSON")
}

fn rules() -> Value {
    serde_saphyr::from_str(&chart_file("rules/artemis-studio.rules.yaml"))
        .expect("rules/artemis-studio.rules.yaml is YAML")
}

/// Every rule of the rules file: (alert or record name, the rule).
fn rules_of(file: &Value) -> Vec<(String, Value)> {
    let mut out = vec![];
    for g in file["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["alert"]
                .as_str()
                .or(r["record"].as_str())
                .unwrap_or("?")
                .to_string();
            out.push((name, r.clone()));
        }
    }
    out
}

#[test]
fn the_dashboard_queries_only_exported_metrics_and_labels() {
    let exported = exported();
    let queries = dashboard_queries(&dashboard());
    let named: BTreeSet<String> = queries.iter().flat_map(|(_, q)| metrics_in(&tokens(q))).collect();
    assert!(
        queries.len() >= 20 && named.len() >= 15,
        "the dashboard walk found too little: {queries:?}"
    );
    let problems: Vec<String> = queries
        .iter()
        .flat_map(|(at, q)| check_expr(at, q, &exported))
        .collect();
    assert!(
        problems.is_empty(),
        "charts/artemis-studio-operator/dashboards/artemis-studio.json:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_dashboard_panel_ids_are_unique() {
    fn ids(list: &Value, out: &mut Vec<i64>) {
        for p in list.as_array().into_iter().flatten() {
            out.extend(p["id"].as_i64());
            ids(&p["panels"], out);
        }
    }
    let mut all = vec![];
    ids(&dashboard()["panels"], &mut all);
    let unique: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "duplicate panel ids: {all:?}");
}

#[test]
fn the_alerts_query_only_exported_metrics_and_labels() {
    let exported = exported();
    let rules = rules_of(&rules());
    assert!(rules.len() >= 5, "the rules walk found too little: {rules:?}");
    let mut problems = vec![];
    for (name, rule) in &rules {
        let at = format!("rule {name}");
        let Some(expr) = rule["expr"].as_str() else {
            problems.push(format!("{at}: no expr"));
            continue;
        };
        if metrics_in(&tokens(expr)).is_empty() {
            problems.push(format!("{at}: names no {PREFIX}* metric"));
        }
        problems.extend(check_expr(&at, expr, &exported));
    }
    assert!(
        problems.is_empty(),
        "charts/artemis-studio-operator/rules/artemis-studio.rules.yaml:\n{}",
        problems.join("\n")
    );
}

/// The template sets each alert's `for` and threshold from values.yaml: their defaults are the
/// rules file's, every alert has its entry (the template fails without one), the schema lists
/// exactly those alerts, and a threshold has a number at the end of the expr to replace.
#[test]
fn the_alert_values_are_the_rules_file_defaults() {
    let values: Value = serde_saphyr::from_str(&chart_file("values.yaml")).expect("values.yaml is YAML");
    let alerts = values["metrics"]["prometheusRule"]["alerts"]
        .as_object()
        .expect("values.yaml has metrics.prometheusRule.alerts");
    let schema: Value =
        serde_json::from_str(&chart_file("values.schema.json")).expect("values.schema.json is JSON");
    let in_schema: BTreeSet<String> =
        schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["alerts"]["properties"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
    let rules = rules_of(&rules());
    let in_rules: BTreeSet<String> = rules.iter().map(|(n, _)| n.clone()).collect();
    let in_values: BTreeSet<String> = alerts.keys().cloned().collect();
    assert_eq!(
        in_values, in_rules,
        "values.yaml metrics.prometheusRule.alerts vs the rules file"
    );
    assert_eq!(
        in_schema, in_rules,
        "values.schema.json's alerts vs the rules file"
    );
    let mut problems = vec![];
    for (name, rule) in &rules {
        let v = &alerts[name.as_str()];
        if v["for"] != rule["for"] {
            problems.push(format!(
                "{name}: for is {:?} in values.yaml, {:?} in the rules file",
                v["for"], rule["for"]
            ));
        }
        if v["enabled"] != Value::Bool(true) {
            problems.push(format!("{name}: not enabled by default"));
        }
        let expr = rule["expr"].as_str().unwrap_or_default().trim();
        if let Some(threshold) = v.get("threshold") {
            let mut words = expr.rsplit(char::is_whitespace);
            let literal = words.next().and_then(|w| w.parse::<f64>().ok());
            let compares = words
                .next()
                .is_some_and(|op| matches!(op, ">" | "<" | ">=" | "<=" | "==" | "!="));
            match (literal, threshold.as_f64()) {
                (Some(l), Some(t)) if compares && l == t => {}
                (l, t) => problems.push(format!(
                    "{name}: the threshold is {t:?} in values.yaml, the expr ends with {l:?} (compared: {compares}): {expr}"
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every alert's runbook is `README.md#troubleshooting-by-condition-reason: <row>`, `<row>`
/// the first cell of a row of that table (backticks dropped).
#[test]
fn every_alert_runbook_is_a_readme_troubleshooting_row() {
    let section = crate::config_contract::readme_section("Troubleshooting by condition reason");
    let rows: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix('|'))
        .filter_map(|l| l.split('|').next())
        .map(|cell| cell.replace('`', "").trim().to_string())
        .collect();
    let mut problems = vec![];
    for (name, rule) in rules_of(&rules()) {
        let runbook = rule["annotations"]["runbook"].as_str().unwrap_or_default();
        match runbook.strip_prefix(RUNBOOK_ANCHOR) {
            Some(row) if rows.contains(row) => {}
            Some(row) => problems.push(format!("{name}: no troubleshooting row {row:?}")),
            None => problems.push(format!(
                "{name}: runbook {runbook:?} does not start with {RUNBOOK_ANCHOR:?}"
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_finds_unknown_metrics_and_labels() {
    let exported = exported_from(
        "# TYPE artemis_studio_x counter\nartemis_studio_x_total{node=\"a,b}\",kind=\"k\"} 1\n\
         # TYPE artemis_studio_h histogram\nartemis_studio_h_bucket{kind=\"k\",le=\"0.1\"} 1\n\
         # TYPE artemis_studio_g gauge\n# EOF\n",
    );
    assert_eq!(
        exported.get("artemis_studio_x_total"),
        Some(&Some(BTreeSet::from(["node".to_string(), "kind".to_string()])))
    );
    assert_eq!(exported.get("artemis_studio_g"), Some(&None));
    let ok = [
        r#"sum by (node, job) (rate(artemis_studio_x_total{kind=~"$k", node!="x"}[$__rate_interval]))"#,
        "histogram_quantile(0.9, sum by (kind, le) (rate(artemis_studio_h_bucket[5m])))",
        "sum(rate(artemis_studio_x_total[5m])) by (kind) > 0 and on (kind) artemis_studio_h_bucket",
        "label_values(artemis_studio_x_total{job=~\"$job\"}, node)",
        "max by (whatever) (artemis_studio_g)",
    ];
    for e in ok {
        assert_eq!(check_expr("ok", e, &exported), Vec::<String>::new(), "{e}");
    }
    for (e, needle) in [
        (
            "rate(artemis_studio_y_total[5m])",
            "artemis_studio_y_total is not",
        ),
        ("artemis_studio_x", "artemis_studio_x is not"),
        (r#"artemis_studio_x_total{cluster="c"}"#, "no label \"cluster\""),
        ("sum by (le) (artemis_studio_x_total)", "no label \"le\""),
        ("sum(artemis_studio_x_total) by (cause)", "no label \"cause\""),
        ("label_values(artemis_studio_h_bucket, node)", "no label \"node\""),
        (
            "artemis_studio_x_total and on (cause) artemis_studio_h_bucket",
            "no label \"cause\"",
        ),
    ] {
        let problems = check_expr("bad", e, &exported);
        assert!(
            problems.iter().any(|p| p.contains(needle)),
            "{e}: expected {needle:?} in {problems:?}"
        );
    }
}
