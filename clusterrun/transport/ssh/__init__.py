"""SSH to the nodes as OpenSSH users know it: ``transport`` (the SshTransport, over paramiko), ``target`` and
``resolve`` (where a connection goes: the inventory over ssh_config, read as ``ssh -G`` reads it, with ``config``,
``scan``, ``keywords`` and ``words`` where OpenSSH is absent), ``jump_spec`` (ProxyJump), ``proxy``
(ProxyCommand), ``known_hosts`` (host keys), ``stream`` (a command's channel), ``dial`` (the TCP connection
dialled first) and ``paramiko_lib`` (paramiko, imported once, quietly)."""
