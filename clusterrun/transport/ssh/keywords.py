"""The keywords OpenSSH's client accepts in ssh_config, for reading a config where the ``ssh`` binary is absent.

OpenSSH refuses a file with a keyword it does not know ("Bad configuration option"), unless an earlier
``IgnoreUnknown`` names it; clusterrun's reader does the same, so a misspelled ``HostNmae`` stops clusterrun
exactly where it stops ``ssh`` instead of being skipped (and clusterrun connecting somewhere else).

The list is what OpenSSH 9.2's ``ssh -G`` takes without "Bad configuration option" (deprecated and
unsupported keywords included: OpenSSH reads past them), plus the keywords of later releases (``Tag``,
``ObscureKeystrokeTiming``, ``ChannelTimeout``), since a newer client's config must not stop an older reader.
"""

from __future__ import annotations

_TEXT = """
    addkeystoagent addressfamily afstokenpassing batchmode bindaddress bindinterface canonicaldomains
    canonicalizefallbacklocal canonicalizehostname canonicalizemaxdots canonicalizepermittedcnames
    casignaturealgorithms certificatefile challengeresponseauthentication channeltimeout checkhostip cipher
    ciphers clearallforwardings compression compressionlevel connectionattempts connecttimeout controlmaster
    controlpath controlpersist dsaauthentication dynamicforward enableescapecommandline enablesshkeysign
    escapechar exitonforwardfailure fallbacktorsh fingerprinthash forkafterauthentication forwardagent
    forwardx11 forwardx11timeout forwardx11trusted gatewayports globalknownhostsfile globalknownhostsfile2
    gssapiauthentication gssapiclientidentity gssapidelegatecredentials gssapikexalgorithms gssapikeyexchange
    gssapirenewalforcesrekey gssapiserveridentity gssapitrustdns hashknownhosts host
    hostbasedacceptedalgorithms hostbasedauthentication hostbasedkeytypes hostkeyalgorithms hostkeyalias
    hostname identitiesonly identityagent identityfile identityfile2 ignoreunknown include ipqos
    kbdinteractiveauthentication kbdinteractivedevices keepalive kerberosauthentication kerberostgtpassing
    kexalgorithms knownhostscommand localcommand localforward loglevel logverbose macs match
    nohostauthenticationforlocalhost numberofpasswordprompts obscurekeystroketiming passwordauthentication
    permitlocalcommand permitremoteopen pkcs11provider port preferredauthentications protocol
    protocolkeepalives proxycommand proxyjump proxyusefdpass pubkeyacceptedalgorithms pubkeyacceptedkeytypes
    pubkeyauthentication rekeylimit remotecommand remoteforward requesttty requiredrsasize revokedhostkeys
    rhostsauthentication rhostsrsaauthentication rsaauthentication securitykeyprovider sendenv
    serveralivecountmax serveraliveinterval sessiontype setenv setuptimeout skeyauthentication smartcarddevice
    stdinnull streamlocalbindmask streamlocalbindunlink stricthostkeychecking syslogfacility tag tcpkeepalive
    tisauthentication tunnel tunneldevice updatehostkeys useblacklistedkeys useprivilegedport user
    userknownhostsfile userknownhostsfile2 useroaming usersh verifyhostkeydns visualhostkey xauthlocation
"""
KEYWORDS = frozenset(_TEXT.split())
