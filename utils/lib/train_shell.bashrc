# shellcheck shell=bash
# rc file of the interactive training shell (_container.sh with no arguments, native runtime): the user's
# own ~/.bashrc first, then the project venv on top, so tools like pyenv cannot put another python3 first.
# shellcheck source=/dev/null
[[ -f ~/.bashrc ]] && source ~/.bashrc
if [[ -n ${TRAIN_SHELL_VENV:-} && -f $TRAIN_SHELL_VENV/bin/activate ]]; then
  # shellcheck source=/dev/null
  source "$TRAIN_SHELL_VENV/bin/activate"
fi
