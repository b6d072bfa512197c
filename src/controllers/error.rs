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
    DeleteRefused(String),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
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
