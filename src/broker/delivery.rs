//! A queue's delivery (issue 49): the broker's own pause, persisted or not, and whether the
//! pause it holds is persisted.

use serde_json::{Value, json};

use super::error::BrokerError;
use super::jolokia::JolokiaRequest;
use super::management::BrokerManagement;
use super::mbean;

impl BrokerManagement {
    /// `pause(true)` (persisted: a broker restart keeps it) or `resume()` on the queue's own
    /// MBean.
    pub async fn set_paused(
        &self,
        address: &str,
        routing_type: &str,
        queue: &str,
        paused: bool,
    ) -> Result<(), BrokerError> {
        let mbean = mbean::queue(self.broker_name(), address, routing_type, queue);
        let request = match paused {
            true => JolokiaRequest::exec(mbean, "pause(boolean)", vec![json!(true)]),
            false => JolokiaRequest::exec(mbean, "resume()", vec![]),
        };
        self.client().call(request).await.map(|_| ())
    }

    /// The queue's `PersistedPause` (QueueControl.isPersistedPause, Artemis 2.41+: ARTEMIS-5207),
    /// read by the queue's own MBean. None: the broker has no such attribute (Artemis 2.40) or
    /// no such queue there — Jolokia answers both with 404, and the queue's own read says which.
    pub async fn pause_persisted(
        &self,
        address: &str,
        routing_type: &str,
        queue: &str,
    ) -> Result<Option<bool>, BrokerError> {
        let mbean = mbean::queue(self.broker_name(), address, routing_type, queue);
        match self
            .client()
            .call(JolokiaRequest::read(mbean, "PersistedPause"))
            .await
        {
            Ok(Value::Bool(persisted)) => Ok(Some(persisted)),
            Ok(other) => Err(BrokerError::BadResponse(format!(
                "the queue's PersistedPause is not a boolean: {other}"
            ))),
            Err(e) if e.is_no_such_mbean() => Ok(None),
            Err(e) => Err(e),
        }
    }
}
