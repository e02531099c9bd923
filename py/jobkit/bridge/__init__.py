"""bridge: the host-command bridge. An agent in a container with no Slurm or ssh asks, through files in a
directory both sides see, a server the person started on the host to run a command; a policy that parses the
command (never a regex on its text) decides. Runs on the host; the client (utils/host_cmd.py) is one stdlib
file that imports nothing of jobkit.

  shellwords  a command line as words, pipes, && || ; and a few redirections; anything else refused by rule
  policy      configs/bridge_policy.yaml (+ site-local file) and the decision: a Plan of argvs, or Refused
  pin         the repository's own code, pinned at start: a changed script is never run for an agent
  runner      runs a Plan: argv, clean env, one process group per pipeline, deadline, bounded output
  server      the request dir (0700, own files only, ids once), taken/lost, results, audit log, cleanup
  commands    `jobkit bridge serve|stop|status|log|policy` (click only)

May import: core.
"""
