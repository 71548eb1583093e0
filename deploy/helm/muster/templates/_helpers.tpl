{{- define "muster.fullname" -}}
{{- printf "%s-muster" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "muster.image" -}}
{{- $tag := required "image.tag is required: the tag scripts/build-image gave the image (muster:<git describe --tags --always --dirty>, or the TAG you set), e.g. --set image.tag=v1.2.3 (docs/install.md, Helm chart)" .Values.image.tag -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "muster.labels" -}}
app.kubernetes.io/name: muster
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "muster.authoritySelector" -}}
app.kubernetes.io/name: muster
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: authority
{{- end -}}

{{/* The files of `muster init`, as Secret keys and their paths in DIR. */}}
{{- define "muster.dataItems" -}}
- {key: authority.json, path: authority.json}
- {key: storage.key, path: storage.key}
{{- range $f := list "admin" "agent" "bootstrap" "policy" "server" }}
- {key: ca-{{ $f }}.crt, path: ca/{{ $f }}.crt}
- {key: ca-{{ $f }}.key, path: ca/{{ $f }}.key}
{{- end }}
- {key: ca-root.crt, path: ca/root.crt}
{{- end -}}

{{/* The authority's pod spec, shared by the StatefulSet and the Deployment. */}}
{{- define "muster.authorityPod" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
initContainers:
  - name: copy-data
    image: {{ .Values.authority.initImage }}
    # cp -n: the files of init come in once; what the authority writes
    # (muster.db with SQLite, audit-checkpoint.json, audit-head) stays.
    command: ["sh", "-c", "mkdir -p /data/authority/ca && cp -rn /seed/. /data/authority/ && chmod -R go-rwx /data/authority"]
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    volumeMounts:
      - {name: seed, mountPath: /seed, readOnly: true}
      - {name: data, mountPath: /data}
containers:
  - name: authority
    image: {{ include "muster.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args: ["authority"]
    env:
      - {name: MUSTER_DATA, value: /data/authority}
      - {name: MUSTER_LISTEN, value: "0.0.0.0:7443"}
      - {name: MUSTER_METRICS_LISTEN, value: "0.0.0.0:7444"}
      - {name: MUSTER_ADVERTISE, value: {{ default (printf "%s.%s.svc:%d" (include "muster.fullname" .) .Release.Namespace (int .Values.authority.service.port)) .Values.authority.advertise | quote }}}
      - {name: MUSTER_AGENT_CERT_TTL, value: {{ .Values.authority.agentCertTTL | quote }}}
      - {name: MUSTER_LOG_FORMAT, value: json}
      - {name: MUSTER_LOG_LEVEL, value: {{ .Values.authority.logLevel | quote }}}
      {{- if (.Values.authority.resources.limits).memory }}
      # The container's memory limit, in bytes: the authority gives the Go
      # collector 90% of it as its soft limit (GOMEMLIMIT), so a heap grown
      # near the limit is collected sooner instead of the pod being killed
      # (docs/performance.md, "Agent streams"). GOMEMLIMIT in the container's
      # environment, were one added to it, would win.
      - name: MUSTER_MEMORY_LIMIT
        valueFrom: {resourceFieldRef: {containerName: authority, resource: limits.memory}}
      {{- end }}
      {{- with .Values.authority.postgres.urlSecret }}
      - name: MUSTER_STORE
        valueFrom: {secretKeyRef: {name: {{ . }}, key: url}}
      {{- end }}
      {{- with .Values.authority.postgres.passwordSecret }}
      - name: PGPASSWORD
        valueFrom: {secretKeyRef: {name: {{ . }}, key: password}}
      {{- end }}
    ports:
      - {name: api, containerPort: 7443}
      - {name: metrics, containerPort: 7444}
    # The metrics listener opens once the store is open, after the schema
    # migrations, which have no deadline (docs/install.md, "Upgrades"):
    # without a startup probe the liveness probe would kill an authority whose
    # migration takes over 30 s, rolling it back, again at every restart.
    startupProbe:
      httpGet: {path: /healthz, port: metrics}
      periodSeconds: 10
      failureThreshold: {{ div (add (int .Values.authority.startSeconds) 9) 10 | max 1 }}
    livenessProbe:
      httpGet: {path: /healthz, port: metrics}
      periodSeconds: 10
    readinessProbe:
      httpGet: {path: /readyz, port: metrics}
      periodSeconds: 5
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    resources: {{- toYaml .Values.authority.resources | nindent 6 }}
    volumeMounts:
      - {name: data, mountPath: /data}
      # The root filesystem is read-only, and SQLite keeps the temporary
      # files of a large sort or index build (an upgrade's migration) in
      # /tmp: without a writable one they fail with "disk I/O error".
      - {name: tmp, mountPath: /tmp}
volumes:
  - name: tmp
    emptyDir: {sizeLimit: {{ .Values.authority.tmpSizeLimit }}}
  - name: seed
    secret:
      secretName: {{ .Values.authority.dataSecret }}
      defaultMode: 0400
      items:
        {{- include "muster.dataItems" . | nindent 8 }}
        {{- if not .Values.authority.postgres.urlSecret }}
        - {key: muster.db, path: muster.db}
        {{- end }}
{{- end -}}
