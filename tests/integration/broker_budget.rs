//! The per-node request budget and call batching against a real broker: many concurrent single
//! calls through one client become few POSTs, each caller gets its own answer, and no more POSTs
//! are ever in flight to the node than the budget permits.

use std::time::Duration;

use serde_json::Value;

use artemis_studio_operator::broker::budget::MAX_IN_FLIGHT;
use artemis_studio_operator::broker::{Credentials, JolokiaClient, JolokiaRequest, Registry, mbean};

use crate::support::{TestBed, brokers_shared};

#[tokio::test]
async fn two_hundred_concurrent_calls_share_a_few_posts_within_the_budget() {
    let _brokers = brokers_shared().await;
    let bed = TestBed::get();
    let broker = bed.broker("c1");
    let (username, password) = bed.broker_user();
    // The budget and the metrics are this test's own (its registry): concurrent tests on c1 do
    // not count here.
    let url = broker.jolokia.clone();
    let registry = Registry::standalone();
    let client = JolokiaClient::new(
        artemis_studio_operator::broker::jolokia::http_client(&registry, None).expect("client"),
        url.clone(),
        None,
        Credentials { username, password },
        Duration::from_secs(5),
    );
    let names = client
        .call(JolokiaRequest::search(mbean::broker_search_pattern()))
        .await
        .expect("search the broker MBean");
    let broker_mbean = names
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .expect("one broker MBean")
        .to_string();
    let version = client
        .call(JolokiaRequest::read(&broker_mbean, "Version"))
        .await
        .expect("Version");
    let node_id = client
        .call(JolokiaRequest::read(&broker_mbean, "NodeID"))
        .await
        .expect("NodeID");
    assert!(version.is_string() && node_id.is_string(), "{version} {node_id}");

    let (requests_before, posts_before) = (registry.requests_of(&url), registry.posts_of(&url));
    let calls = 200;
    let tasks = (0..calls).map(|i| {
        let client = client.clone();
        let mbean = broker_mbean.clone();
        tokio::spawn(async move {
            let attribute = match i % 3 {
                0 => "Version".to_string(),
                1 => "NodeID".to_string(),
                // An attribute the broker does not have: this caller, and only this one, gets
                // the broker's 404 naming it.
                _ => format!("NoSuchAttribute_{i}_"),
            };
            (
                i,
                attribute.clone(),
                client.call(JolokiaRequest::read(mbean, &attribute)).await,
            )
        })
    });
    for joined in futures::future::join_all(tasks).await {
        let (i, attribute, result) = joined.expect("task");
        match i % 3 {
            0 => assert_eq!(result.expect("Version"), version, "call {i}"),
            1 => assert_eq!(result.expect("NodeID"), node_id, "call {i}"),
            _ => {
                let e = result.expect_err("a missing attribute fails");
                let text = e.to_string();
                assert!(text.contains(&attribute), "call {i}: {text}");
            }
        }
    }

    let requests = registry.requests_of(&url) - requests_before;
    let posts = registry.posts_of(&url) - posts_before;
    // Issue 45: identical reads in one POST go once (src/broker/batch.rs, `SharedReads`): the
    // missing attributes are each their own, Version and NodeID at most once per POST each.
    let distinct = (calls / 3) as u64;
    assert!(
        requests >= distinct + 2 && requests <= distinct + 2 * posts,
        "{requests} operations for {calls} calls in {posts} POSTs: each distinct read once per POST"
    );
    assert!(posts < calls as u64 / 4, "{posts} POSTs for {calls} calls");
    let stats = registry.node_stats(&url).expect("the node has a budget");
    assert!(
        stats.max_in_flight >= 1 && stats.max_in_flight <= MAX_IN_FLIGHT,
        "{stats:?}"
    );
    assert_eq!(stats.in_flight, 0, "{stats:?}");
    eprintln!("{calls} calls: {posts} POSTs; budget {stats:?}");
}
