//! Process exit codes, one per outcome class.

/// How the process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: everything succeeded.
    Ok,
    /// 1: the run failed.
    RunFailed,
    /// 2: invalid input (pipeline, flags, values).
    Invalid,
    /// 130: interrupted by the user (SIGINT, Ctrl-C).
    Interrupted,
    /// 143: cancelled by SIGTERM.
    Terminated,
    /// 129: cancelled by SIGHUP.
    HungUp,
    /// 126: the hidden `sandbox-exec` could not confine or start its
    /// command (a shell's code for "cannot execute"; a `Bash` result
    /// shows it as the exit status).
    CannotExecute,
    /// 127: the hidden `sandbox-exec` found no such command.
    CommandNotFound,
    /// 141: the reader of what a command prints went away (`| head`), as
    /// if by SIGPIPE.
    ReaderGone,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::RunFailed => 1,
            Exit::Invalid => 2,
            Exit::Interrupted => 130,
            Exit::Terminated => 143,
            Exit::HungUp => 129,
            Exit::CannotExecute => 126,
            Exit::CommandNotFound => 127,
            Exit::ReaderGone => 141,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}
