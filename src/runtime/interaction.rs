//! Tool approvals beyond `allowedTools`: the `grantStageTool` request and
//! the one-shot grants of a stage execution (`grants`), the messages of an
//! approval (`messages`), the run's hub that arbitrates them (`hub`) and
//! the interactors that answer (`interactors`: rules from an answers file
//! (`answers`), `--yolo`, a person through a prompter). See
//! ARCHITECTURE.md, Actors and ownership.

mod answers;
mod grants;
mod hub;
mod interactors;
mod messages;
mod remember;
mod remote;

pub use answers::{AnswerRule, AnswerRules};
pub use grants::{GrantDecision, GrantError, GrantLedger, GrantRequest, args_digest, args_summary};
pub use hub::{InteractionHub, InteractorSpec, form_fillers, start_hub};
pub use interactors::{
    FormView, PromptView, Prompter, RuleInteractor, TerminalInteractor, Unwanted, Wanted,
};
pub use messages::{
    Answer, Answered, InteractorHandle, Prompt, Raise, Released, Settle, Unprompt, WithdrawOwner,
};
pub use remember::{Remembered, command_prefix, prefix_matches};
pub use remote::{
    AnswerRemote, ListPending, NotPending, PendingView, RemoteDesk, RemoteInteractor,
};
