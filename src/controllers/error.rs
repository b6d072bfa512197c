//! What a reconcile fails with, and the condition reason each failure shows as on the object.

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Serialization(#[from] serde_json::Error),
    /// A delete that cannot proceed now; the object stays Terminating and is retried.
    #[error("delete refused: {0}")]
    DeleteRefused(#[from] DeleteRefusal),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
}

/// Why a delete cannot finish now: the object stays Terminating (its finalizer held) and the
/// delete is retried with a growing delay (`ReconcileError::DeleteRefused`, which reconcile
/// does not write to the object as an error: the DeleteBlocked condition already says it).
#[derive(Debug, thiserror::Error)]
pub enum DeleteRefusal {
    /// DeleteBlocked says why and how to proceed (its message, written on the object).
    #[error("{message}")]
    Blocked { message: String },
    /// A restart: the cluster's first poll (which triggers this object) comes first.
    #[error("ArtemisCluster {cluster} has not been polled by this operator process yet")]
    NotYetPolled { cluster: String },
}

impl ReconcileError {
    /// The condition reason an error shows as on the object.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Kube(_) => "KubernetesApiError",
            ReconcileError::Store(_) => "AuditStoreUnavailable",
            ReconcileError::Serialization(_) => "InternalError",
            ReconcileError::DeleteRefused(_) => "DeleteRefused",
            ReconcileError::Finalizer(_) => "FinalizerError",
        }
    }
}

impl From<kube::runtime::finalizer::Error<ReconcileError>> for ReconcileError {
    fn from(e: kube::runtime::finalizer::Error<ReconcileError>) -> Self {
        match e {
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
            other => ReconcileError::Finalizer(Box::new(other)),
        }
    }
}
