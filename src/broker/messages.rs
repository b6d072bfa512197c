//! Looking for one message on a queue (issue 48: `kubectl artemis capture verify`).

use serde_json::{Value, json};

use super::management::BrokerManagement;
use super::{BrokerError, JolokiaRequest, mbean};

impl BrokerManagement {
    /// Issue 48 (verify): where a message with this user id (`AMQUserID`: a Core message's
    /// JMSMessageID, an AMQP message's message-id) is on one queue, in one bulk request: waiting
    /// (`browse(1, 1, filter)`, which stops at the first match), being delivered
    /// (`countDeliveringMessages(filter)`, over the in-flight messages only) or scheduled
    /// (`listScheduledMessagesAsJSON()`, matched here). Artemis 2.40 has no index on the id: a
    /// miss scans the queue on the broker (never sent to the caller).
    pub async fn find_message(
        &self,
        queue: (&str, &str, &str),
        user_id: &str,
    ) -> Result<MessagePresence, BrokerError> {
        let (address, routing_type, name) = queue;
        let id = if user_id.starts_with("ID:") {
            user_id.to_string()
        } else {
            format!("ID:{user_id}")
        };
        let filter = format!("AMQUserID = '{}'", id.replace('\'', "''"));
        let mbean = mbean::queue(self.broker_name(), address, routing_type, name);
        let requests = vec![
            JolokiaRequest::exec(
                mbean.clone(),
                "browse(int,int,java.lang.String)",
                vec![json!(1), json!(1), json!(filter)],
            ),
            JolokiaRequest::exec(
                mbean.clone(),
                "countDeliveringMessages(java.lang.String)",
                vec![json!(filter)],
            ),
            JolokiaRequest::exec(mbean, "listScheduledMessagesAsJSON()", vec![]),
        ];
        let mut answers = self.client().call_together(requests).await.into_iter();
        let mut next = || {
            answers
                .next()
                .unwrap_or(Err(BrokerError::BadResponse("no answer".into())))
        };
        let (waiting, delivering, scheduled) = (next()?, next()?, next()?);
        if waiting.as_array().is_some_and(|a| !a.is_empty()) {
            return Ok(MessagePresence::Waiting);
        }
        if delivering.as_i64().is_some_and(|n| n > 0) {
            return Ok(MessagePresence::Delivering);
        }
        let listed: Vec<Value> = scheduled
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        // Listings prefix "ID:" to the user id whatever it held (Message.toMap).
        let matches = |m: &Value| {
            m.get("userID")
                .and_then(Value::as_str)
                .is_some_and(|u| u == id || u.strip_prefix("ID:") == Some(id.as_str()))
        };
        Ok(if listed.iter().any(matches) {
            MessagePresence::Scheduled
        } else {
            MessagePresence::Absent
        })
    }
}

/// Where a message is on one queue (issue 48: verify).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MessagePresence {
    /// On the queue, waiting for a consumer.
    Waiting,
    /// Delivered to a consumer, not yet acknowledged.
    Delivering,
    /// Scheduled for later delivery.
    Scheduled,
    /// Not on this queue.
    Absent,
}
