//! The transport wrapper every connection reads through: it sees each
//! message before the SDK does.

use std::sync::Arc;

use rmcp::service::RoleClient;

use super::listing::ListingCell;

/// A transport that marks the listing stale the moment a
/// `notifications/tools/list_changed` is read, before any message after it
/// (the answer of the call that changed the list) reaches its caller; the
/// SDK runs notification handlers on tasks of their own, too late for that.
pub(super) struct Watched<T> {
    pub(super) inner: T,
    pub(super) cell: Arc<ListingCell>,
}

impl<T: rmcp::transport::Transport<RoleClient>> rmcp::transport::Transport<RoleClient>
    for Watched<T>
{
    type Error = T::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        use rmcp::model::ServerNotification as N;
        let cell = Arc::clone(&self.cell);
        async move {
            loop {
                let message = self.inner.receive().await;
                let Some(rmcp::model::JsonRpcMessage::Notification(n)) = &message else {
                    return message;
                };
                match n.notification {
                    N::ToolListChangedNotification(_) => cell.mark_stale(),
                    // Nothing of troupe's reads these, and the SDK starts
                    // a task for each notification it is handed: a server
                    // that sends them by the hundred thousand (a chatty
                    // log) held hundreds of megabytes. Read and dropped.
                    N::LoggingMessageNotification(_)
                    | N::ProgressNotification(_)
                    | N::ResourceUpdatedNotification(_)
                    | N::ResourceListChangedNotification(_)
                    | N::PromptListChangedNotification(_) => continue,
                    _ => {}
                }
                return message;
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
