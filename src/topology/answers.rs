//! What a write's answer says the broker holds (issues 23 and 45): Artemis answers `createQueue`
//! and `updateQueue` with the queue's configuration right after the write, in the same call, so
//! the answer is the write's evidence and no read follows it.

use serde_json::Value;

use super::inventory::QueueInfo;

/// The queue a `createQueue` answer describes (the broker returns the created QueueConfiguration
/// as a JSON string): the write's own evidence, laid over the snapshot until the next poll reads
/// it. Fields a 2.40 scrape cannot read stay unknown here too, so the poll finds nothing changed;
/// counts are those of a new queue (0).
pub fn created_queue(answer: &Value) -> Option<QueueInfo> {
    let c: Value = serde_json::from_str(answer.as_str()?).ok()?;
    let text = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
    let flag = |k: &str, default: bool| c.get(k).and_then(Value::as_bool).unwrap_or(default);
    let int = |k: &str, default: i64| c.get(k).and_then(Value::as_i64).unwrap_or(default);
    Some(QueueInfo {
        name: text("name")?,
        address: text("address")?,
        routing_type: text("routing-type")?,
        filter: text("filter-string").filter(|f| !f.is_empty()),
        durable: flag("durable", true),
        max_consumers: int("max-consumers", -1),
        exclusive: flag("exclusive", false),
        last_value: flag("last-value", false),
        last_value_key: text("last-value-key"),
        non_destructive: None,
        purge_on_no_consumers: flag("purge-on-no-consumers", false),
        enabled: flag("enabled", true),
        paused: false,
        pause_persisted: None,
        consumers_before_dispatch: int("consumers-before-dispatch", 0),
        delay_before_dispatch: int("delay-before-dispatch", -1),
        consumer_priority: None,
        ring_size: int("ring-size", -1),
        group_rebalance: flag("group-rebalance", false),
        group_buckets: int("group-buckets", -1),
        group_first_key: text("group-first-key"),
        auto_delete: flag("auto-delete", false),
        auto_delete_delay: None,
        auto_delete_message_count: None,
        temporary: flag("temporary", false),
        message_count: 0,
        consumer_count: 0,
        delivering_count: 0,
    })
}

/// The queue an `updateQueue` answer describes, laid over the queue as read before it (issue
/// 45: the answer is the update's evidence, no verifying read). Artemis answers with the queue's
/// configuration right after the update, in the same synchronized call
/// (`ActiveMQServerControlImpl.updateQueue` → `locateQueue(..).getQueueConfiguration()`), so a
/// field `PostOfficeImpl.updateQueue` does not apply to an existing queue (last-value,
/// last-value-key, auto-delete and its delay and count, durable) shows its old value there. Two
/// exceptions: the filter, which that answer reports as created (`QueueImpl.setFilter` leaves the
/// configuration's filter-string alone) while `updateQueue` sets any differing filter that
/// parses (one that does not is refused) — so the filter sent is the evidence; and a field the
/// answer leaves out, taken as sent. Counts are the read's.
pub fn updated_queue(read: &QueueInfo, answer: &Value, sent: &Value) -> Option<QueueInfo> {
    let c: Value = serde_json::from_str(answer.as_str()?).ok()?;
    let said = |k: &str| c.get(k).or_else(|| sent.get(k));
    let flag = |k: &str, was: bool| said(k).and_then(Value::as_bool).unwrap_or(was);
    let int = |k: &str, was: i64| said(k).and_then(Value::as_i64).unwrap_or(was);
    let text = |k: &str| {
        said(k)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    };
    Some(QueueInfo {
        filter: sent
            .get("filter-string")
            .and_then(Value::as_str)
            .filter(|f| !f.is_empty())
            .map(str::to_string),
        max_consumers: int("max-consumers", read.max_consumers),
        exclusive: flag("exclusive", read.exclusive),
        last_value: flag("last-value", read.last_value),
        last_value_key: text("last-value-key"),
        purge_on_no_consumers: flag("purge-on-no-consumers", read.purge_on_no_consumers),
        enabled: flag("enabled", read.enabled),
        consumers_before_dispatch: int("consumers-before-dispatch", read.consumers_before_dispatch),
        delay_before_dispatch: int("delay-before-dispatch", read.delay_before_dispatch),
        ring_size: int("ring-size", read.ring_size),
        group_rebalance: flag("group-rebalance", read.group_rebalance),
        group_buckets: int("group-buckets", read.group_buckets),
        group_first_key: text("group-first-key"),
        auto_delete: flag("auto-delete", read.auto_delete),
        ..read.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_answer_is_the_queue_after_it_but_for_its_stale_filter() {
        let read = QueueInfo {
            name: "q".into(),
            address: "q".into(),
            routing_type: "ANYCAST".into(),
            filter: Some("old = 1".into()),
            max_consumers: -1,
            message_count: 7,
            ..Default::default()
        };
        let sent = serde_json::json!({"name": "q", "filter-string": "new = 1", "max-consumers": 5, "last-value": true});
        // Artemis 2.40's answer: the configuration as created for the filter, the applied
        // max-consumers, last-value not applied to an existing queue.
        let answer = Value::String(
            serde_json::json!({"name": "q", "filter-string": "old = 1", "max-consumers": 5, "last-value": false})
                .to_string(),
        );
        let after = super::updated_queue(&read, &answer, &sent).expect("a configuration");
        assert_eq!(after.filter.as_deref(), Some("new = 1"));
        assert_eq!(after.max_consumers, 5);
        assert!(!after.last_value, "what the broker did not apply shows as it is");
        assert_eq!(after.message_count, 7, "counts are the read's");
        assert!(super::updated_queue(&read, &Value::Null, &sent).is_none());
    }
}
