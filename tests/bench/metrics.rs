//! Prometheus text exposition, read from the operator's `/metrics` and the API server's
//! `/metrics`, and the counts the benchmark takes from them.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of an exposition (comments and malformed lines skipped).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let Some(open) = line.find('{') else {
        let (name, value) = line.split_once(' ')?;
        return Some(Sample {
            name: name.to_string(),
            labels: BTreeMap::new(),
            value: value_of(value)?,
        });
    };
    // Labels: key="value" pairs separated by commas; values escape \\, \" and \n.
    let chars: Vec<char> = line[open + 1..].chars().collect();
    let mut labels = BTreeMap::new();
    let mut i = 0;
    loop {
        while matches!(chars.get(i), Some(',' | ' ')) {
            i += 1;
        }
        if *chars.get(i)? == '}' {
            i += 1;
            break;
        }
        let mut key = String::new();
        while *chars.get(i)? != '=' {
            key.push(chars[i]);
            i += 1;
        }
        if *chars.get(i + 1)? != '"' {
            return None;
        }
        i += 2;
        let mut value = String::new();
        loop {
            match *chars.get(i)? {
                '\\' => {
                    value.push(match *chars.get(i + 1)? {
                        'n' => '\n',
                        other => other,
                    });
                    i += 2;
                }
                '"' => {
                    i += 1;
                    break;
                }
                other => {
                    value.push(other);
                    i += 1;
                }
            }
        }
        labels.insert(key, value);
    }
    let rest: String = chars[i..].iter().collect();
    Some(Sample {
        name: line[..open].to_string(),
        labels,
        value: value_of(rest.trim())?,
    })
}

fn value_of(s: &str) -> Option<f64> {
    s.split_whitespace().next()?.parse().ok()
}

/// The sum of a metric's samples whose labels pass `keep`.
pub fn sum(samples: &[Sample], name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && keep(&s.labels))
        .map(|s| s.value)
        .sum()
}

/// The sums of a metric grouped by one label.
pub fn by(samples: &[Sample], name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        let key = s.labels.get(label).cloned().unwrap_or_default();
        *out.entry(key).or_insert(0.0) += s.value;
    }
    out
}

/// What the operator process says it did (its own `/metrics`).
#[derive(Debug, Clone, Default)]
pub struct OperatorCounts {
    /// Jolokia operations by node.
    pub jolokia_by_node: BTreeMap<String, f64>,
    /// Jolokia operations by kind (read, search, or the operation).
    pub jolokia_by_kind: BTreeMap<String, f64>,
    /// Jolokia HTTP POSTs.
    pub posts: f64,
    /// Kubernetes API requests by verb (get, list, watch, create, update, patch, delete).
    pub api_by_verb: BTreeMap<String, f64>,
    /// Polls of every cluster (the count of the poll-duration histogram).
    pub polls: f64,
    /// ArtemisQueue passes that judged a queue against the cluster's snapshot
    /// (`artemis_studio_planned_passes_total`).
    pub queue_planned: f64,
    /// Capture passes (`artemis_studio_capture_passes_total`).
    pub capture_passes: f64,
    /// Polls by cluster (`namespace/name`), and the seconds they took in all.
    pub polls_by_cluster: BTreeMap<String, f64>,
    pub poll_seconds_by_cluster: BTreeMap<String, f64>,
    /// The broker clusters this replica holds now (`artemis_studio_clusters_held`, a gauge:
    /// sharding only).
    pub clusters_held: f64,
}

impl OperatorCounts {
    pub fn from_text(text: &str) -> OperatorCounts {
        let s = parse(text);
        OperatorCounts {
            jolokia_by_node: by(&s, "artemis_studio_jolokia_requests_total", "node"),
            jolokia_by_kind: by(&s, "artemis_studio_jolokia_requests_total", "kind"),
            posts: sum(&s, "artemis_studio_jolokia_posts_total", |_| true),
            api_by_verb: by(&s, "artemis_studio_api_requests_total", "verb"),
            polls: sum(&s, "artemis_studio_inventory_poll_duration_seconds_count", |_| {
                true
            }),
            queue_planned: sum(&s, "artemis_studio_planned_passes_total", |l| {
                l.get("kind").map(String::as_str) == Some("ArtemisQueue")
            }),
            capture_passes: sum(&s, "artemis_studio_capture_passes_total", |_| true),
            polls_by_cluster: by(
                &s,
                "artemis_studio_inventory_poll_duration_seconds_count",
                "cluster",
            ),
            poll_seconds_by_cluster: by(
                &s,
                "artemis_studio_inventory_poll_duration_seconds_sum",
                "cluster",
            ),
            clusters_held: sum(&s, "artemis_studio_clusters_held", |_| true),
        }
    }

    pub fn jolokia(&self) -> f64 {
        self.jolokia_by_node.values().sum()
    }

    /// Jolokia operations that write (everything but reads, searches and the topology query).
    pub fn jolokia_writes(&self) -> f64 {
        self.jolokia_by_kind
            .iter()
            .filter(|(k, _)| !(matches!(k.as_str(), "read" | "search") || k.starts_with("list")))
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0
    }

    pub fn api(&self, verbs: &[&str]) -> f64 {
        verbs
            .iter()
            .map(|v| self.api_by_verb.get(*v).copied().unwrap_or(0.0))
            .sum()
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &OperatorCounts) -> OperatorCounts {
        OperatorCounts {
            jolokia_by_node: diff(&self.jolokia_by_node, &earlier.jolokia_by_node),
            jolokia_by_kind: diff(&self.jolokia_by_kind, &earlier.jolokia_by_kind),
            posts: self.posts - earlier.posts,
            api_by_verb: diff(&self.api_by_verb, &earlier.api_by_verb),
            polls: self.polls - earlier.polls,
            queue_planned: self.queue_planned - earlier.queue_planned,
            capture_passes: self.capture_passes - earlier.capture_passes,
            polls_by_cluster: diff(&self.polls_by_cluster, &earlier.polls_by_cluster),
            poll_seconds_by_cluster: diff(&self.poll_seconds_by_cluster, &earlier.poll_seconds_by_cluster),
            // A gauge: its value now.
            clusters_held: self.clusters_held,
        }
    }
}

/// The API server's request counts (`apiserver_request_total`): every client's, by verb, for
/// the operator's API group and the core resources the operator uses.
#[derive(Debug, Clone, Default)]
pub struct ApiServerCounts {
    /// verb (GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE) → requests.
    pub by_verb: BTreeMap<String, f64>,
}

pub const API_READS: [&str; 2] = ["GET", "LIST"];
pub const API_WRITES: [&str; 5] = ["POST", "PUT", "PATCH", "APPLY", "DELETE"];

impl ApiServerCounts {
    pub fn from_text(text: &str) -> ApiServerCounts {
        let samples = parse(text);
        let mut by_verb = BTreeMap::new();
        for s in samples.iter().filter(|s| s.name == "apiserver_request_total") {
            let group = s.labels.get("group").map(String::as_str).unwrap_or("");
            let resource = s.labels.get("resource").map(String::as_str).unwrap_or("");
            let counted = group == "artemis-studio.io"
                || (group.is_empty() && matches!(resource, "secrets" | "events"))
                || (group == "events.k8s.io");
            if counted {
                let verb = s.labels.get("verb").cloned().unwrap_or_default();
                *by_verb.entry(verb).or_insert(0.0) += s.value;
            }
        }
        ApiServerCounts { by_verb }
    }

    pub fn sum(&self, verbs: &[&str]) -> f64 {
        verbs
            .iter()
            .map(|v| self.by_verb.get(*v).copied().unwrap_or(0.0))
            .sum()
    }

    pub fn since(&self, earlier: &ApiServerCounts) -> ApiServerCounts {
        ApiServerCounts {
            by_verb: diff(&self.by_verb, &earlier.by_verb),
        }
    }
}

fn diff(now: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    now.iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

/// The API server's `/metrics`, read with the admin identity.
pub async fn apiserver(client: &kube::Client) -> Result<ApiServerCounts> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .context("the /metrics request")?;
    let text = client
        .request_text(req)
        .await
        .context("GET the API server's /metrics")?;
    Ok(ApiServerCounts::from_text(&text))
}
