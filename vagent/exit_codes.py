"""Exit statuses and the launcher's environment variable, light to import (no torch): the
command line reads them before anything heavy loads."""

#: set by ``vagent train --nproc`` (the launcher) in the environment of the ranks it starts: its pid
LAUNCHER_PID_ENV = "VAGENT_LAUNCHER_PID"
#: the exit status of a rank of a ``vagent train --nproc`` job that refused to run (a config or a
#: checkpoint it cannot use): the launcher then says to fix that, not to rerun the same command
REFUSED_EXIT = 3

__all__ = ["LAUNCHER_PID_ENV", "REFUSED_EXIT"]
