"""Foundation helpers shared by every layer; they import nothing of lerobot_pipe but each other,
:mod:`lerobot_pipe.constants` and :mod:`lerobot_pipe.fsutil`."""
