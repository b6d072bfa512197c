//! Bare Jolokia, the baseline: the calls a queue command needs, sent straight to the brokers
//! (no operator, no reads, no audit). "Parallel" sends one exec to every node at once (the
//! physical limit of a fan-out); "sequential" sends them node after node (the existing
//! operator's approach). Also the cleanup of everything a run left on the brokers, by prefix.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::future::try_join_all;
use futures::{StreamExt, TryStreamExt, stream};
use serde_json::{Value, json};

use crate::bed::Broker;

#[derive(Clone)]
pub struct Node {
    pub name: String,
    pub url: String,
    /// The broker's MBean: `org.apache.activemq.artemis:broker="<name>"`.
    pub mbean: String,
    origin: String,
}

#[derive(Clone)]
pub struct Jolokia {
    http: reqwest::Client,
    user: (String, String),
    pub nodes: Vec<Node>,
    /// Created queues are durable (see `Config::durable`).
    pub durable: bool,
}

/// The three queue operations of scenario 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    UpdateFilter,
    Delete,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Create, Op::UpdateFilter, Op::Delete];

    pub fn label(self) -> &'static str {
        match self {
            Op::Create => "create queue",
            Op::UpdateFilter => "update filter",
            Op::Delete => "delete queue",
        }
    }
}

fn origin_of(url: &str) -> String {
    // scheme://host, what the brokers' strict origin checking accepts.
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.split(['/', ':']).next().unwrap_or(rest);
            format!("{scheme}://{host}")
        }
        None => url.to_string(),
    }
}

impl Jolokia {
    /// A client for these brokers; resolves each one's broker name (one search per node).
    pub async fn connect(brokers: &[Broker], user: (String, String)) -> Result<Jolokia> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?;
        let mut j = Jolokia {
            http,
            user,
            nodes: vec![],
            durable: true,
        };
        for b in brokers {
            let mut node = Node {
                name: b.name.clone(),
                url: b.jolokia.clone(),
                mbean: String::new(),
                origin: origin_of(&b.jolokia),
            };
            let found = j
                .post(
                    &node,
                    &json!({"type": "search", "mbean": "org.apache.activemq.artemis:broker=*"}),
                )
                .await?;
            node.mbean = found
                .as_array()
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{}: no broker MBean found", b.name))?;
            j.nodes.push(node);
        }
        Ok(j)
    }

    async fn send(&self, node: &Node, body: &Value) -> Result<Value> {
        let post = || {
            self.http
                .post(&node.url)
                .basic_auth(&self.user.0, Some(&self.user.1))
                .header("Origin", &node.origin)
                .json(body)
                .send()
        };
        // A pooled keep-alive connection the broker closed as it was reused ("connection closed
        // before message completed", twice at 10,000 queues) is tried once more on a new one.
        let resp = match post().await {
            Err(e) if e.is_request() && !e.is_timeout() => post().await,
            r => r,
        }
        .with_context(|| format!("POST to {}", node.name))?;
        let text = resp.text().await?;
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON: {text:.200}", node.name))
    }

    /// One operation; its `value`, or the broker's refusal as an error.
    pub async fn post(&self, node: &Node, body: &Value) -> Result<Value> {
        let answer = self.send(node, body).await?;
        check(&node.name, answer)
    }

    /// Several operations in one POST; each element's value or refusal.
    pub async fn bulk(&self, node: &Node, bodies: Vec<Value>) -> Result<Vec<Result<Value>>> {
        if bodies.is_empty() {
            return Ok(vec![]);
        }
        let answer = self.send(node, &Value::Array(bodies)).await?;
        let items = answer
            .as_array()
            .ok_or_else(|| anyhow!("{}: a bulk answer that is not a list", node.name))?;
        Ok(items.iter().map(|v| check(&node.name, v.clone())).collect())
    }

    fn exec(&self, node: &Node, operation: &str, arguments: Vec<Value>) -> Value {
        json!({"type": "exec", "mbean": node.mbean, "operation": operation, "arguments": arguments})
    }

    /// The one exec an operation needs on one node.
    pub fn request(&self, node: &Node, op: Op, queue: &str) -> Value {
        match op {
            Op::Create => {
                let config = json!({"name": queue, "address": queue, "routing-type": "ANYCAST",
                    "durable": self.durable, "auto-create-address": true});
                self.exec(
                    node,
                    "createQueue(java.lang.String,boolean)",
                    vec![json!(config.to_string()), json!(false)],
                )
            }
            Op::UpdateFilter => {
                let config = json!({"name": queue, "address": queue, "routing-type": "ANYCAST",
                    "filter-string": "bench = 1"});
                self.exec(
                    node,
                    "updateQueue(java.lang.String)",
                    vec![json!(config.to_string())],
                )
            }
            Op::Delete => self.exec(
                node,
                "destroyQueue(java.lang.String,boolean,boolean)",
                vec![json!(queue), json!(false), json!(false)],
            ),
        }
    }

    /// Wait until every node answers (the test bed is shared: a test elsewhere may be
    /// restarting a broker); an error naming the silent nodes after `timeout`.
    pub async fn wait_up(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut down = vec![];
            for n in &self.nodes {
                let read = json!({"type": "read", "mbean": n.mbean, "attribute": "Active"});
                if self.post(n, &read).await.is_err() {
                    down.push(n.name.clone());
                }
            }
            if down.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("brokers {} did not answer for {timeout:?}", down.join(", "));
            }
            println!(
                "bench: waiting for brokers {} (down or restarting)",
                down.join(", ")
            );
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }

    /// One operation on every node at once: the physical limit of a fan-out.
    pub async fn parallel(&self, op: Op, queue: &str) -> Result<Duration> {
        let start = Instant::now();
        try_join_all(
            self.nodes
                .iter()
                .map(|n| async move { self.post(n, &self.request(n, op, queue)).await }),
        )
        .await?;
        Ok(start.elapsed())
    }

    /// One operation node after node: the existing operator's approach.
    pub async fn sequential(&self, op: Op, queue: &str) -> Result<Duration> {
        let start = Instant::now();
        for n in &self.nodes {
            self.post(n, &self.request(n, op, queue)).await?;
        }
        Ok(start.elapsed())
    }

    /// `op` for every queue, `in_flight` queues at a time, each fanned out (parallel or
    /// sequential); the elapsed time.
    pub async fn many(
        &self,
        op: Op,
        queues: &[String],
        in_flight: usize,
        parallel: bool,
    ) -> Result<Duration> {
        let start = Instant::now();
        stream::iter(queues.iter())
            .map(|q| async move {
                if parallel {
                    self.parallel(op, q).await
                } else {
                    self.sequential(op, q).await
                }
            })
            .buffer_unordered(in_flight.max(1))
            .try_collect::<Vec<_>>()
            .await?;
        Ok(start.elapsed())
    }

    /// `op` for every queue in bulk: on each node (the nodes in parallel) POSTs of `per_post`
    /// operations one after another — what batching can reach; the elapsed time.
    pub async fn bulk_many(&self, op: Op, queues: &[String], per_post: usize) -> Result<Duration> {
        let start = Instant::now();
        try_join_all(self.nodes.iter().map(|n| async move {
            for chunk in queues.chunks(per_post.max(1)) {
                let bodies = chunk.iter().map(|q| self.request(n, op, q)).collect();
                for r in self.bulk(n, bodies).await? {
                    r?;
                }
            }
            Ok::<(), anyhow::Error>(())
        }))
        .await?;
        Ok(start.elapsed())
    }

    /// Remove from every node each queue, divert and address whose name starts with one of
    /// `prefixes` (and the settings of capture queues): whatever a run left behind. Returns
    /// how many objects it removed. The addresses go last, once every node's queues went: in a
    /// broker cluster an address keeps the remote bindings of the other nodes' queues ("has
    /// bindings") until those are gone and the news reached it.
    pub async fn remove_by_prefix(&self, prefixes: &[String]) -> Result<usize> {
        let mut found = vec![];
        for node in &self.nodes {
            found.push(self.names_by_prefix(node, prefixes).await?);
        }
        let mut removed = 0;
        for (node, names) in self.nodes.iter().zip(&found) {
            let exec1 = |op: &str, arg: &String| self.exec(node, op, vec![json!(arg)]);
            let capture = names
                .queues
                .iter()
                .filter(|q| q.starts_with("artemis-studio.capture."));
            // Diverts first (they keep addresses), then queues, capture settings.
            let steps: [Vec<Value>; 3] = [
                names
                    .diverts
                    .iter()
                    .map(|d| exec1("destroyDivert(java.lang.String)", d))
                    .collect(),
                names
                    .queues
                    .iter()
                    .map(|q| {
                        self.exec(
                            node,
                            "destroyQueue(java.lang.String,boolean,boolean)",
                            vec![json!(q), json!(true), json!(false)],
                        )
                    })
                    .collect(),
                capture
                    .flat_map(|q| {
                        [
                            exec1("removeAddressSettings(java.lang.String)", q),
                            exec1("removeSecuritySettings(java.lang.String)", q),
                        ]
                    })
                    .collect(),
            ];
            for step in steps {
                removed += self.exec_all(node, &step).await?.len();
            }
        }
        let addresses: Vec<Vec<String>> = found.into_iter().map(|n| n.addresses).collect();
        Ok(removed + self.delete_addresses(addresses).await?)
    }

    /// The queues, diverts and addresses on `node` whose names start with one of `prefixes`.
    async fn names_by_prefix(&self, node: &Node, prefixes: &[String]) -> Result<BrokerNames> {
        let names = |attr: &str| json!({"type": "read", "mbean": node.mbean, "attribute": attr});
        let read = self
            .bulk(
                node,
                vec![names("QueueNames"), names("DivertNames"), names("AddressNames")],
            )
            .await?;
        let list = |i: usize| -> Vec<String> {
            read.get(i)
                .and_then(|r| r.as_ref().ok())
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .filter(|n| prefixes.iter().any(|p| n.starts_with(p.as_str())))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(BrokerNames {
            queues: list(0),
            diverts: list(1),
            addresses: list(2),
        })
    }

    /// Every operation on `node`, 200 to a POST; the indexes of those that succeeded.
    async fn exec_all(&self, node: &Node, operations: &[Value]) -> Result<Vec<usize>> {
        let mut done = vec![];
        for (c, chunk) in operations.chunks(200).enumerate() {
            let results = self.bulk(node, chunk.to_vec()).await?;
            done.extend(
                results
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_ok())
                    .map(|(i, _)| c * 200 + i),
            );
        }
        Ok(done)
    }

    /// Delete each node's addresses (`addresses` in `nodes`' order); those still bound to
    /// another node's queue are tried again, at most three times a second apart. How many went.
    async fn delete_addresses(&self, mut addresses: Vec<Vec<String>>) -> Result<usize> {
        let mut removed = 0;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            for (node, left) in self.nodes.iter().zip(addresses.iter_mut()) {
                let deletes: Vec<Value> = left
                    .iter()
                    .map(|a| self.exec(node, "deleteAddress(java.lang.String)", vec![json!(a)]))
                    .collect();
                let done: HashSet<usize> = self.exec_all(node, &deletes).await?.into_iter().collect();
                removed += done.len();
                *left = left
                    .drain(..)
                    .enumerate()
                    .filter(|(i, _)| !done.contains(i))
                    .map(|(_, a)| a)
                    .collect();
            }
            if addresses.iter().all(Vec::is_empty) {
                break;
            }
        }
        Ok(removed)
    }
}

/// Names of one node's objects.
struct BrokerNames {
    queues: Vec<String>,
    diverts: Vec<String>,
    addresses: Vec<String>,
}

fn check(node: &str, answer: Value) -> Result<Value> {
    match answer.get("status").and_then(Value::as_i64) {
        Some(200) => Ok(answer.get("value").cloned().unwrap_or(Value::Null)),
        status => bail!(
            "{node}: Jolokia status {status:?}: {}",
            answer
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error text")
        ),
    }
}
